// The pricing catalog (deploy/pricing.yaml, common/pricing.h), the cost arithmetic, and
// the cost that `zenflow run` reports.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/pricing.h"
#include "tests/support/scratch.h"
#include "tests/support/tiny_job.h"

namespace fs = std::filesystem;
using zenflow::PricingCatalog;
using zenflow::PricingError;

namespace {

const std::string kShipped = std::string(ZENFLOW_SOURCE_DIR) + "/deploy/pricing.yaml";

// One valid row; tests edit it.
std::string row(const std::string& name = "box.8x", const std::string& price = "32") {
  return "  - name: " + name +
         "\n"
         "    provider: onprem\n"
         "    region: null\n"
         "    gpu_model: H100-SXM5-80GB\n"
         "    gpu_count: 8\n"
         "    gpu_memory_gib: 80\n"
         "    vcpus: 96\n"
         "    ram_gib: 1024\n"
         "    nic_gbps: null\n"
         "    pcie_gen: 5\n"
         "    on_demand_usd_per_hour: " + price +
         "\n"
         "    spot_usd_per_hour: {min: 1, max: 2}\n"
         "    source: \"rack invoice 2026-11\"\n"
         "    date: 2026-11-29\n"
         "    verified: true\n";
}

std::string error_of(const std::string& text, const std::string& origin = "cat.yaml") {
  try {
    PricingCatalog::parse(text, origin);
  } catch (const PricingError& e) {
    return e.what();
  }
  return "";
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

double cents(double usd) { return std::round(usd * 100.0) / 100.0; }

}  // namespace

TEST(Pricing, ShippedCatalogLoadsAndEveryRowHasSourceAndDate) {
  const PricingCatalog c = PricingCatalog::load(kShipped);
  for (const char* name :
       {"p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5.4xlarge", "p5en.48xlarge", "g5.xlarge", "g6.xlarge",
        "g6.48xlarge", "g6e.xlarge", "g6e.48xlarge", "a2-highgpu-8g", "a2-ultragpu-8g", "a3-highgpu-8g",
        "g2-standard-8", "ND96amsr_A100_v4", "ND96isr_H100_v5", "ND96isr_H200_v5", "gpu_8x_h100_sxm5"})
    EXPECT_NE(c.find_instance(name), nullptr) << name;
  EXPECT_EQ(c.instances().size(), 18u);
  for (const auto& r : c.instances()) {
    EXPECT_FALSE(r.source.empty()) << r.name;
    EXPECT_EQ(r.date.size(), 10u) << r.name;
    EXPECT_GT(r.gpu_count, 0) << r.name;
    // An unverified price is allowed; a verified row has a price.
    if (r.verified) {
      EXPECT_TRUE(r.on_demand_usd_per_hour.has_value()) << r.name;
    }
  }
  const auto* p4d = c.find_instance("p4d.24xlarge");
  ASSERT_NE(p4d, nullptr);
  EXPECT_DOUBLE_EQ(*p4d->on_demand_usd_per_hour, 21.958);
  EXPECT_EQ(p4d->gpu_count, 8);
  EXPECT_DOUBLE_EQ(p4d->spot_usd_per_hour->min, 2.47);
  EXPECT_TRUE(p4d->verified);
  // A row whose price nobody could source: no price, not verified.
  const auto* h200 = c.find_instance("ND96isr_H200_v5");
  ASSERT_NE(h200, nullptr);
  EXPECT_FALSE(h200->on_demand_usd_per_hour.has_value());
  EXPECT_FALSE(h200->verified);
  EXPECT_FALSE(c.find_instance("a2-highgpu-8g")->verified);  // ≈ total
  EXPECT_EQ(c.find_instance("nosuch"), nullptr);
}

TEST(Pricing, BadCatalogsNameTheFileAndKeyPath) {
  const std::string head = "instances:\n";
  const std::string good = head + row("a") + row("b") + row("c") + row("d");
  EXPECT_EQ(error_of(good), "");
  EXPECT_EQ(error_of(head + row("a") + row("b") + row("c") + row("d", "-1"), "deploy/pricing.yaml"),
            "deploy/pricing.yaml: instances[3].on_demand_usd_per_hour: must be >= 0, got -1");
  EXPECT_EQ(error_of(head + row("a", ".inf")), "cat.yaml: instances[0].on_demand_usd_per_hour: must be a finite "
                                               "number, got .inf");
  EXPECT_EQ(error_of(head + row("a", "nan")), "cat.yaml: instances[0].on_demand_usd_per_hour: must be a finite "
                                              "number, got nan");
  EXPECT_EQ(error_of(head + row("a") + replace(row("b"), "    source: \"rack invoice 2026-11\"\n", "")),
            "cat.yaml: instances[1].source: required");
  EXPECT_EQ(error_of(head + replace(row("a"), "    date: 2026-11-29\n", "")), "cat.yaml: instances[0].date: required");
  EXPECT_EQ(error_of(head + replace(row("a"), "2026-11-29", "last week")),
            "cat.yaml: instances[0].date: must be a date YYYY-MM-DD, got last week");
  EXPECT_EQ(error_of(head + row("a") + row("b") + replace(row("c"), "    verified: true\n", "    verifed: true\n")),
            "cat.yaml: instances[2].verifed: unknown key");
  EXPECT_EQ(error_of(head + replace(row("a"), "{min: 1, max: 2}", "{min: 1, max: 2, avg: 1.5}")),
            "cat.yaml: instances[0].spot_usd_per_hour.avg: unknown key");
  EXPECT_EQ(error_of(head + replace(row("a"), "{min: 1, max: 2}", "{min: 3, max: 2}")),
            "cat.yaml: instances[0].spot_usd_per_hour.min: must be <= max, got 3 > 2");
  EXPECT_EQ(error_of(head + row("a") + row("b") + row("a")), "cat.yaml: instances[2].name: duplicate name 'a'");
  EXPECT_EQ(error_of(head + row("a") + "extra: 1\n"), "cat.yaml: extra: unknown key");
  EXPECT_EQ(error_of("instances: {}\n"), "cat.yaml: instances: must be a sequence");
  EXPECT_EQ(error_of(head + replace(row("a"), "gpu_count: 8", "gpu_count: 2.5")),
            "cat.yaml: instances[0].gpu_count: must be an integer, got 2.5");
  EXPECT_EQ(error_of(head + replace(row("a"), "verified: true", "verified: maybe")),
            "cat.yaml: instances[0].verified: must be true or false");
  try {
    PricingCatalog::load("/nonexistent/pricing.yaml");
    ADD_FAILURE();
  } catch (const PricingError& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/pricing.yaml: cannot read the pricing catalog");
  }
}

TEST(Pricing, OverrideFileReplacesOrAddsRowsByName) {
  PricingCatalog c = PricingCatalog::load(kShipped);
  const size_t n = c.instances().size();
  c.merge(PricingCatalog::parse("instances:\n" + row("p4d.24xlarge", "12.5") + row("onprem.rack3", "7"), "mine.yaml"));
  EXPECT_EQ(c.instances().size(), n + 1);
  EXPECT_DOUBLE_EQ(*c.find_instance("p4d.24xlarge")->on_demand_usd_per_hour, 12.5);
  EXPECT_EQ(c.find_instance("p4d.24xlarge")->provider, "onprem");
  EXPECT_DOUBLE_EQ(*c.find_instance("onprem.rack3")->on_demand_usd_per_hour, 7.0);
  EXPECT_DOUBLE_EQ(*c.find_instance("p5.48xlarge")->on_demand_usd_per_hour, 55.04);  // untouched
}

TEST(Pricing, CostArithmeticIsExactToTheCent) {
  // A crafted run: 1.5 h on a p5.48xlarge ($55.04/h, 8 GPUs) using 2 of its GPUs, 20% of
  // the time exposed stalls, 86M tokens.
  const double seconds = 5400, price = 55.04, stalls = 0.2 * seconds;
  const double usd = zenflow::usd_for(seconds, price, 2, 8);
  EXPECT_NEAR(usd, 20.64, 1e-9);  // 55.04 × 2/8 × 1.5
  EXPECT_EQ(cents(usd), 20.64);
  EXPECT_NEAR(zenflow::usd_lost_to_stalls(stalls, price, 2, 8), 4.128, 1e-9);  // 55.04 × 2/8 × 0.3
  EXPECT_EQ(cents(zenflow::usd_lost_to_stalls(stalls, price, 2, 8)), 4.13);
  EXPECT_NEAR(*zenflow::usd_per_million_tokens(usd, 86'000'000), 0.24, 1e-12);
  EXPECT_FALSE(zenflow::usd_per_million_tokens(usd, 0).has_value());
  // A CPU run (0 GPUs used) and more GPUs than the instance has: the whole instance.
  EXPECT_NEAR(zenflow::usd_for(seconds, price, 0, 8), 82.56, 1e-9);
  EXPECT_NEAR(zenflow::usd_for(seconds, price, 16, 8), 82.56, 1e-9);
  EXPECT_NEAR(zenflow::usd_for(seconds, price, 1, 0), 82.56, 1e-9);  // instance without GPUs
  EXPECT_DOUBLE_EQ(zenflow::instance_share(3, 8), 0.375);
  // p4d.24xlarge, 1 of 8 GPUs, 10 minutes: 21.958 / 8 / 6 = 0.457458...
  EXPECT_EQ(cents(zenflow::usd_for(600, 21.958, 1, 8)), 0.46);
  EXPECT_THROW(zenflow::usd_for(-1, price, 1, 8), std::invalid_argument);
  EXPECT_THROW(zenflow::usd_for(1, NAN, 1, 8), std::invalid_argument);
  EXPECT_THROW(zenflow::usd_for(1, price, -1, 8), std::invalid_argument);
}

TEST(Pricing, ResolvePriceSpecRateFirstThenCatalogElseWarning) {
  const PricingCatalog c = PricingCatalog::load(kShipped);
  std::vector<std::string> w;
  zenflow::CostSpec cost;
  EXPECT_FALSE(zenflow::resolve_price(cost, &c, &w).priced);
  EXPECT_TRUE(w.empty());

  cost.instance_type = "p4d.24xlarge";
  auto r = zenflow::resolve_price(cost, &c, &w);
  EXPECT_TRUE(r.priced);
  EXPECT_DOUBLE_EQ(r.usd_per_hour, 21.958);
  EXPECT_EQ(r.gpus_of_instance, 8);
  EXPECT_EQ(r.date, "2026-11-29");
  EXPECT_NE(r.source.find("skypilot-catalog"), std::string::npos);
  EXPECT_TRUE(w.empty());

  cost.usd_per_hour = 3.6;  // the spec's rate wins, charged in full
  r = zenflow::resolve_price(cost, &c, &w);
  EXPECT_DOUBLE_EQ(r.usd_per_hour, 3.6);
  EXPECT_EQ(r.gpus_of_instance, 0);
  EXPECT_EQ(r.source, "cost.usd_per_hour");

  cost.usd_per_hour.reset();
  cost.instance_type = "nosuch";
  EXPECT_FALSE(zenflow::resolve_price(cost, &c, &w).priced);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].rfind("cost.instance_type: 'nosuch' is not in the pricing catalog, so the job's cost is not "
                       "computed", 0),
            0u)
      << w[0];
  w.clear();
  cost.instance_type = "ND96isr_H200_v5";  // in the catalog, no price
  EXPECT_FALSE(zenflow::resolve_price(cost, &c, &w).priced);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("has no on-demand price"), std::string::npos) << w[0];
}

// ---- zenflow run ----
namespace {

const std::string kTiny = zenflow::test_support::tiny_job_spec_beside_it("pricing-test");

struct Output {
  int code;
  std::string out;
};

Output sh(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string tiny_spec() {
  const fs::path dir = zenflow::test_support::removed_at_exit(
      fs::temp_directory_path() / ("zenflow-pricing-" + std::to_string(::getpid())));
  fs::create_directories(dir);
  std::ofstream(dir / "tiny.yaml") << kTiny;
  return (dir / "tiny.yaml").string();
}

const std::string kZenflow = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow";

}  // namespace

TEST(PricingCli, RunJsonCostIsWallTimesTheSpecRate) {
  const Output o = sh(kZenflow + " run " + tiny_spec() + " --no-resume --quiet --json --set cost.usd_per_hour=3.6 2>/dev/null");
  ASSERT_EQ(o.code, 0) << o.out;
  const nlohmann::json j = nlohmann::json::parse(o.out.substr(o.out.find('{')));
  const double wall = j.at("wall_seconds").get<double>();
  EXPECT_GT(wall, 0.0);
  EXPECT_NEAR(j.at("cost_usd").get<double>(), wall * 3.6 / 3600.0, 1e-9);
  EXPECT_DOUBLE_EQ(j.at("usd_per_hour").get<double>(), 3.6);
  const double tokens = 3.0 * j.at("tokens_per_step").get<double>();
  EXPECT_NEAR(j.at("usd_per_1m_tokens").get<double>(), j.at("cost_usd").get<double>() * 1e6 / tokens, 1e-9);
  double stalls = 0;
  for (const auto& kv : j.at("stall_seconds").items()) stalls += kv.value().get<double>();
  EXPECT_NEAR(j.at("usd_lost_to_stalls").get<double>(), stalls * 3.6 / 3600.0, 1e-9);
  EXPECT_EQ(j.at("pricing").at("source").get<std::string>(), "cost.usd_per_hour");
}

TEST(PricingCli, CatalogInstanceOnTheCpuPaysTheWholeInstance) {
  const Output o =
      sh(kZenflow + " run " + tiny_spec() + " --no-resume --quiet --json --set cost.instance_type=p4d.24xlarge 2>/dev/null");
  ASSERT_EQ(o.code, 0) << o.out;
  const nlohmann::json j = nlohmann::json::parse(o.out.substr(o.out.find('{')));
  EXPECT_NEAR(j.at("cost_usd").get<double>(), j.at("wall_seconds").get<double>() * 21.958 / 3600.0, 1e-9);
  EXPECT_EQ(j.at("pricing").at("instance").get<std::string>(), "p4d.24xlarge");
  EXPECT_EQ(j.at("pricing").at("date").get<std::string>(), "2026-11-29");
  EXPECT_DOUBLE_EQ(j.at("pricing").at("gpu_share").get<double>(), 1.0);
}

TEST(PricingCli, UnknownInstanceWarnsAndComputesNoCost) {
  const Output o = sh(kZenflow + " run " + tiny_spec() + " --no-resume --quiet --json --set cost.instance_type=nosuch 2>&1");
  ASSERT_EQ(o.code, 0) << o.out;
  EXPECT_NE(o.out.find("zenflow: warning: cost.instance_type: 'nosuch' is not in the pricing catalog, so the "
                       "job's cost is not computed"),
            std::string::npos)
      << o.out;
  const nlohmann::json j = nlohmann::json::parse(o.out.substr(o.out.rfind("\n{") + 1));
  EXPECT_TRUE(j.at("cost_usd").is_null());
}

TEST(PricingCli, BadPricingFileExitsTwoNamingTheKey) {
  const fs::path bad = fs::path(tiny_spec()).parent_path() / "bad-pricing.yaml";
  std::ofstream(bad) << "instances:\n" << row("x", "-1");
  const Output o = sh(kZenflow + " run " + tiny_spec() + " --no-resume --quiet --pricing " + bad.string() + " 2>&1");
  EXPECT_EQ(o.code, 2) << o.out;
  EXPECT_NE(o.out.find("zenflow: invalid pricing catalog: " + bad.string() +
                       ": instances[0].on_demand_usd_per_hour: must be >= 0, got -1"),
            std::string::npos)
      << o.out;
}
