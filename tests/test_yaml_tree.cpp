// yaml::parse: the tree the job spec validator walks, against yaml-cpp's reading of the
// same text, and its limits on hostile documents.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/yaml_tree.h"

namespace zenflow {
namespace {

using yaml::Node;

// A tree as one line: null as ~, scalars quoted, maps and lists in flow style.
std::string show(const Node& n) {
  switch (n.type()) {
    case Node::Type::kNull:
      return "~";
    case Node::Type::kScalar:
      return "'" + n.text() + "'";
    case Node::Type::kSequence: {
      std::string out = "[";
      for (std::size_t i = 0; i < n.size(); ++i) out += (i ? ", " : "") + show(n.item(i));
      return out + "]";
    }
    case Node::Type::kMap: {
      std::string out = "{";
      for (std::size_t i = 0; i < n.size(); ++i) out += (i ? ", " : "") + show(n.key(i)) + ": " + show(n.value(i));
      return out + "}";
    }
  }
  return "?";
}

// yaml-cpp's reading in the same notation.
std::string show(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar:
      return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence: {
      std::string out = "[";
      for (std::size_t i = 0; i < n.size(); ++i) out += (i ? ", " : "") + show(n[i]);
      return out + "]";
    }
    case YAML::NodeType::Map: {
      std::string out = "{";
      bool first = true;
      for (const auto& kv : n) {
        out += (first ? "" : ", ") + show(kv.first) + ": " + show(kv.second);
        first = false;
      }
      return out + "}";
    }
    default:
      return "~";
  }
}

std::string error_of(const std::string& text) {
  try {
    yaml::parse(text);
  } catch (const yaml::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(YamlTree, ReadsScalarsListsAndMapsInDocumentOrder) {
  EXPECT_EQ(show(yaml::parse("b: 1\na: [x, 'y z', {k: v}]\nc:\n  - 2\n  - 3.5\n")),
            "{'b': '1', 'a': ['x', 'y z', {'k': 'v'}], 'c': ['2', '3.5']}");
  // Only a plain, untagged null is null; quoted or tagged it is text.
  EXPECT_EQ(show(yaml::parse("a:\nb: ~\nc: null\nd: 'null'\ne: \"~\"\nf: !!str null\ng: NULL\nh: nil\n")),
            "{'a': ~, 'b': ~, 'c': ~, 'd': 'null', 'e': '~', 'f': 'null', 'g': ~, 'h': 'nil'}");
  // Repeated keys are kept (the validator names them); find and set take the first.
  const Node twice = yaml::parse("k: 1\nk: 2\n");
  ASSERT_EQ(twice.size(), 2u);
  EXPECT_EQ(twice.find("k")->text(), "1");
  EXPECT_EQ(twice.find("absent"), nullptr);
  // Block scalars, escapes and multi-line plain scalars as YAML folds them.
  EXPECT_EQ(show(yaml::parse("a: |\n  l1\n  l2\nb: >\n  f1\n  f2\nc: \"t\\tq\\\"\\u00e9\"\nd: one\n  two\n")),
            "{'a': 'l1\nl2\n', 'b': 'f1 f2\n', 'c': 't\tq\"\xc3\xa9', 'd': 'one two'}");
  EXPECT_TRUE(yaml::parse("").is_null());
  EXPECT_TRUE(yaml::parse("# only a comment\n").is_null());
  EXPECT_EQ(show(yaml::parse("--- \nx: 1\n...\n")), "{'x': '1'}");
}

TEST(YamlTree, SetAddsOrReplacesAMapValue) {
  Node root = yaml::parse("a: 1\nb: {c: 2}\n");
  root.set("a") = Node::scalar("9");
  Node& b = root.set("b");
  b.set("d") = Node::map();
  root.set("e") = Node::scalar("new");
  EXPECT_EQ(show(root), "{'a': '9', 'b': {'c': '2', 'd': {}}, 'e': 'new'}");
  Node scalar = Node::scalar("x");
  EXPECT_THROW(scalar.set("k"), std::logic_error);
}

TEST(YamlTree, ExpandsAliasesAsCopies) {
  const Node n = yaml::parse("base: &b {lr: 0.1, steps: [1, 2]}\nuse: *b\nname: &n x\nagain: *n\n");
  EXPECT_EQ(show(n), "{'base': {'lr': '0.1', 'steps': ['1', '2']}, 'use': {'lr': '0.1', 'steps': ['1', '2']}, "
                     "'name': 'x', 'again': 'x'}");
  const std::string unknown = error_of("a: *nowhere\n");
  EXPECT_NE(unknown.find("line 1, column 4"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("*nowhere names no anchor"), std::string::npos) << unknown;
}

TEST(YamlTree, ReadsWhatYamlCppReadsOnEverySpecShape) {
  std::vector<std::string> texts = {
      "name: tiny\nmodel: {arch: llama, config: {hidden_size: 32}}\ndata: {train: x.txt, tokenizer: byte}\n",
      "optimizer:\n  mode: zenflow  # comment\n  zenflow: {topk_ratio: 0.1, overlap_step: true}\n"
      "  host:\n    reserved_cores: [0, 1, 2]\n    addresses:\n      - 127.0.0.1:4000\n      - \"h:1\"\n",
      "cost: {instance_type: 'p4d.24xlarge', usd_per_hour: ~}\nresources: {host_memory_gb: auto, priority: -3}\n",
      "a: 'it''s'\nb: \"x\\ny\"\nc: 1e3\nd: +1\ne: .5\nf: -x\ng: 'k: v'\nh: \"#h\"\n",
      "list:\n- a\n- - b\n  - c\n- {d: e}\n",
      "k: \"caf\\xe9\"\nm: \"\\x01\"\n",
  };
  const std::filesystem::path examples = std::filesystem::path(ZENFLOW_SOURCE_DIR) / "examples";
  for (const auto& entry : std::filesystem::directory_iterator(examples)) {
    if (entry.path().extension() != ".yaml") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    texts.push_back(text.str());
  }
  ASSERT_GE(texts.size(), 7u) << "no example spec found under " << examples;
  for (const std::string& t : texts) EXPECT_EQ(show(yaml::parse(t)), show(YAML::Load(t))) << t;
}

TEST(YamlTree, MalformedYamlNamesItsLineAndColumn) {
  const std::string open_list = error_of("name: x\nlist: [a, b\n");
  EXPECT_EQ(open_list.rfind("line 3, column 1: did not find expected ',' or ']'", 0), 0u) << open_list;
  EXPECT_NE(open_list.find("while parsing a flow sequence at line 2, column 7"), std::string::npos) << open_list;
  const std::string tab = error_of("a:\n\tb: 1\n");
  EXPECT_EQ(tab.rfind("line 2, column 1: ", 0), 0u) << tab;
  const std::string second = error_of("a: 1\n---\nb: 2\n");
  EXPECT_EQ(second, "line 2, column 1: a second YAML document (a job spec is one document)");
  EXPECT_NE(error_of("a: b: c\n"), "");
  EXPECT_NE(error_of("\"unterminated\n"), "");
  EXPECT_NE(error_of("{a: 1"), "");
}

TEST(YamlTree, HostileDocumentsStopAtTheLimits) {
  // 128 levels are read; one more is refused, in flow and block style alike.
  const auto flow = [](int levels) { return std::string(levels, '[') + std::string(levels, ']'); };
  Node deep = yaml::parse(flow(yaml::kMaxDepth));
  int levels = 0;
  for (const Node* n = &deep; n->is_sequence(); n = n->size() ? &n->item(0) : nullptr) {
    ++levels;
    if (!n->size()) break;
  }
  EXPECT_EQ(levels, yaml::kMaxDepth);
  EXPECT_NE(error_of(flow(yaml::kMaxDepth + 1)).find("nested deeper than 128 levels"), std::string::npos);
  std::string block;
  for (int i = 0; i <= yaml::kMaxDepth; ++i) block += std::string(2 * i, ' ') + "k:\n";
  EXPECT_NE(error_of(block).find("nested deeper than 128 levels"), std::string::npos);
  // An alias cannot lift a subtree past the depth either.
  const std::string lifted = "a: &a " + flow(yaml::kMaxDepth - 1) + "\nb: [*a]\n";
  EXPECT_NE(error_of(lifted).find("nested deeper than 128 levels"), std::string::npos) << error_of(lifted);
  // "Billion laughs": each level doubles; 2^21 leaves pass the node budget and are refused
  // (quickly), 2^10 are read.
  std::string laughs = "l0: &l0 [x, x]\n";
  for (int i = 1; i <= 20; ++i)
    laughs += "l" + std::to_string(i) + ": &l" + std::to_string(i) + " [*l" + std::to_string(i - 1) + ", *l" +
              std::to_string(i - 1) + "]\n";
  const auto start = std::chrono::steady_clock::now();
  const std::string laughed = error_of(laughs);
  EXPECT_NE(laughed.find("more than 1048576 nodes"), std::string::npos) << laughed;
  std::printf("billion laughs refused after %.1f ms\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  std::string small = "l0: &l0 [x, x]\n";
  for (int i = 1; i <= 9; ++i)
    small += "l" + std::to_string(i) + ": &l" + std::to_string(i) + " [*l" + std::to_string(i - 1) + ", *l" +
             std::to_string(i - 1) + "]\n";
  const Node ok = yaml::parse(small);
  const Node* n = ok.find("l9");
  ASSERT_NE(n, nullptr);
  int leaves_depth = 0;
  while (n->is_sequence()) {
    ASSERT_EQ(n->size(), 2u);
    n = &n->item(1);
    ++leaves_depth;
  }
  EXPECT_EQ(leaves_depth, 10);
  EXPECT_EQ(n->text(), "x");
}

}  // namespace
}  // namespace zenflow
