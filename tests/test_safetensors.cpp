// safetensors: round trips per dtype, interchange with Python, zero-copy, corrupt files, shards.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/bounded_call.h"
#include "tests/support/shell.h"
#include "common/remove_tree.h"
#include "worker/model/safetensors.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using zenflow::model::SafetensorsFile;
using zenflow::model::SafetensorsIndex;
using zenflow::model::write_safetensors;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

namespace {

const std::string kPython = "/usr/bin/python3";

fs::path scratch_dir(const std::string& name) {
  const fs::path dir = fs::path(ZENFLOW_BINARY_DIR) / "test-tmp" / "test_safetensors" / name;
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

using zenflow::test_support::run;

const auto& write_bytes = zenflow::test_support::write_file;

const auto& read_bytes = zenflow::test_support::read_file;

// A file with the given header text and data bytes; header_len overrides the length field.
fs::path raw_file(const fs::path& path, const std::string& header, const std::string& data,
                  uint64_t header_len = UINT64_MAX) {
  if (header_len == UINT64_MAX) header_len = header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &header_len, 8);
  write_bytes(path, bytes + header + data);
  return path;
}

std::string open_error(const fs::path& path) {
  try {
    SafetensorsFile f(path.string());
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

// One tensor per dtype the writer supports, with values exact in every dtype.
Named sample_tensors() {
  const at::Tensor base = at::arange(-6, 6, at::kDouble).reshape({3, 4}) * 0.5;
  return {
      {"f64", base.clone()},
      {"f32", base.to(at::kFloat)},
      {"f16", base.to(at::kHalf)},
      {"bf16", base.to(at::kBFloat16)},
      {"i64", (base * 1e9).to(at::kLong)},
      {"i32", (base * 1000).to(at::kInt)},
      {"i16", (base * 100).to(at::kShort)},
      {"i8", (base * 20).to(at::kChar)},
      {"u8", (base * 20 + 128).to(at::kByte)},
      {"bool", base > 0},
      {"scalar", at::scalar_tensor(2.5, at::kFloat)},
      {"empty", at::empty({0, 3}, at::kFloat)},
      {"transposed", at::arange(12, at::kFloat).reshape({3, 4}).t()},  // not contiguous
  };
}

}  // namespace

TEST(Safetensors, RoundTripsEveryDtype) {
  const fs::path path = scratch_dir("round-trip") / "model.safetensors";
  const Named tensors = sample_tensors();
  write_safetensors(path.string(), tensors, {{"format", "pt"}, {"note", "zenflow test"}});
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));

  const SafetensorsFile file(path.string());
  EXPECT_EQ(file.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"note", "zenflow test"}}));
  std::vector<std::string> order;
  for (const auto& [name, t] : tensors) order.push_back(name);
  EXPECT_EQ(file.names(), order);  // data order is the order written
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    const at::Tensor got = file.tensor(name);
    EXPECT_EQ(got.scalar_type(), t.scalar_type());
    EXPECT_EQ(got.sizes(), t.sizes());
    EXPECT_TRUE(at::equal(got, t));
    EXPECT_EQ(file.info(name).dtype, t.scalar_type());
  }
  uint64_t header_len;
  std::memcpy(&header_len, read_bytes(path).data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(file.info("f64").dtype_name, "F64");
  EXPECT_EQ(file.info("bf16").dtype_name, "BF16");
  EXPECT_EQ(file.info("bool").dtype_name, "BOOL");
  EXPECT_THROW(file.info("absent"), std::out_of_range);
}

TEST(Safetensors, TensorsAreZeroCopyAndKeepTheMappingAlive) {
  const fs::path path = scratch_dir("zero-copy") / "model.safetensors";
  const at::Tensor w = at::randn({64, 32});
  write_safetensors(path.string(), {{"w", w}, {"b", at::randn({32})}});
  at::Tensor kept;
  {
    const SafetensorsFile file(path.string());
    kept = file.tensor("w");
    const auto* p = static_cast<const uint8_t*>(kept.data_ptr());
    EXPECT_GE(p, file.mapped_data());
    EXPECT_LE(p + kept.nbytes(), file.mapped_data() + file.mapped_size());
    EXPECT_EQ(p, file.bytes("w").first);
    EXPECT_EQ(file.tensor("w").data_ptr(), kept.data_ptr());  // the same bytes, not a copy
  }
  EXPECT_TRUE(at::equal(kept, w));  // the file object is gone; the mapping is not
}

TEST(Safetensors, PythonReadsWhatCppWrites) {
  const fs::path dir = scratch_dir("cpp-to-python");
  const fs::path path = dir / "model.safetensors";
  const Named tensors = sample_tensors();
  write_safetensors(path.string(), tensors, {{"format", "pt"}});
  const fs::path script = dir / "read.py";
  write_bytes(script, R"(import json, struct, sys, torch
DT = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
      "BOOL": torch.bool}
buf = bytearray(open(sys.argv[1], "rb").read())
(n,) = struct.unpack("<Q", buf[:8])
header = json.loads(buf[8:8 + n])
out = {"__metadata__": header.pop("__metadata__", {})}
for name, e in header.items():
    b, end = e["data_offsets"]
    raw = buf[8 + n + b:8 + n + end]
    t = torch.frombuffer(raw, dtype=DT[e["dtype"]]) if raw else torch.empty(0, dtype=DT[e["dtype"]])
    out[name] = {"dtype": e["dtype"], "shape": e["shape"],
                 "values": t.reshape(e["shape"]).double().flatten().tolist()}
print(json.dumps(out))
)");
  std::string out;
  ASSERT_EQ(run(kPython + " " + script.string() + " " + path.string(), &out), 0) << out;
  const json got = json::parse(out);
  EXPECT_EQ(got["__metadata__"], json({{"format", "pt"}}));
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(got.contains(name));
    EXPECT_EQ(got[name]["shape"].get<std::vector<int64_t>>(), t.sizes().vec());
    const at::Tensor flat = t.to(at::kDouble).contiguous().flatten();
    const std::vector<double> want(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
    EXPECT_EQ(got[name]["values"].get<std::vector<double>>(), want);
  }
}

TEST(Safetensors, CppReadsWhatPythonWrites) {
  const fs::path dir = scratch_dir("python-to-cpp");
  const fs::path path = dir / "model.safetensors";
  const fs::path script = dir / "write.py";
  // Keys not in data order, and a 3-element F16 tensor that leaves the next F32 tensor at
  // an offset that is not a multiple of 4 (the header is padded to 8 bytes, as writers do).
  write_bytes(script, R"(import json, struct, sys, torch
NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
tensors = [("half", torch.tensor([1.5, -2.0, 65504.0], dtype=torch.float16)),
           ("weight", torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4),
           ("bf", torch.tensor([[0.15625, -3.0]], dtype=torch.bfloat16)),
           ("ids", torch.tensor([1, -2, 2**40], dtype=torch.int64))]
header, blobs, offset = {}, [], 0
for name, t in tensors:
    data = t.contiguous().view(torch.uint8).numpy().tobytes()
    header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
header = dict(reversed(list(header.items())))
header["__metadata__"] = {"source": "python"}
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
print(json.dumps({name: t.double().flatten().tolist() for name, t in tensors}))
)");
  std::string out;
  ASSERT_EQ(run(kPython + " " + script.string() + " " + path.string(), &out), 0) << out;
  const json want = json::parse(out);
  const SafetensorsFile file(path.string());
  EXPECT_EQ(file.names(), (std::vector<std::string>{"half", "weight", "bf", "ids"}));
  EXPECT_EQ(file.metadata().at("source"), "python");
  EXPECT_EQ(file.tensor("weight").sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(file.tensor("bf").scalar_type(), at::kBFloat16);
  for (const auto& [name, values] : want.items()) {
    SCOPED_TRACE(name);
    const at::Tensor t = file.tensor(name).to(at::kDouble).flatten();
    EXPECT_EQ(std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel()),
              values.get<std::vector<double>>());
  }
  EXPECT_EQ(file.info("weight").begin % 4, 2u);  // misaligned: served as an aligned copy
  EXPECT_EQ(reinterpret_cast<uintptr_t>(file.tensor("weight").data_ptr()) % 4, 0u);
}

TEST(Safetensors, CorruptFilesGiveClearErrors) {
  const fs::path dir = scratch_dir("corrupt");
  const auto expect_error = [](const fs::path& path, const std::string& problem) {
    const std::string error = open_error(path);
    EXPECT_NE(error.find(path.string()), std::string::npos) << error;
    EXPECT_NE(error.find(problem), std::string::npos) << "want \"" << problem << "\" in: " << error;
  };
  const std::string f32x4 = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string data16(16, '\x01');

  write_bytes(dir / "empty.safetensors", "");
  expect_error(dir / "empty.safetensors", "too short for the 8-byte header length");
  write_bytes(dir / "five.safetensors", "abcde");
  expect_error(dir / "five.safetensors", "too short");
  expect_error(raw_file(dir / "long-header.safetensors", f32x4, data16, 1000), "header length 1000 exceeds");
  expect_error(raw_file(dir / "huge-header.safetensors", f32x4, data16, uint64_t{1} << 40), "exceeds");
  expect_error(raw_file(dir / "truncated-data.safetensors", f32x4, data16.substr(0, 10)), "truncated");
  expect_error(raw_file(dir / "bad-json.safetensors", R"({"w":{"dtype":"F32",)", data16), "not valid JSON");
  expect_error(raw_file(dir / "array.safetensors", "[1, 2]", ""), "not a JSON object");
  expect_error(raw_file(dir / "unknown-dtype.safetensors",
                        R"({"w":{"dtype":"F12","shape":[2,2],"data_offsets":[0,16]}})", data16),
               "tensor 'w': unknown dtype \"F12\"");
  expect_error(raw_file(dir / "shape-mismatch.safetensors",
                        R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", data16),
               "tensor 'w': shape [2, 3] of F32 needs 24 bytes but data_offsets [0,16] span 16");
  expect_error(raw_file(dir / "negative-shape.safetensors",
                        R"({"w":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}})", data16),
               "non-natural size");
  expect_error(raw_file(dir / "overlap.safetensors",
                        R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                        data16),
               "tensor 'b' (data bytes 8..16) overlaps tensor 'a'");
  expect_error(raw_file(dir / "gap.safetensors",
                        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                        data16),
               "data bytes 4..8 before tensor 'b' belong to no tensor");
  expect_error(raw_file(dir / "trailing.safetensors", f32x4, data16 + "xyz"), "3 trailing bytes");
  expect_error(raw_file(dir / "reversed-offsets.safetensors",
                        R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", data16),
               "end before they begin");
  expect_error(
      raw_file(dir / "bad-metadata.safetensors",
               R"({"__metadata__":{"n":1},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", data16),
      "__metadata__[\"n\"] is not a string");
  expect_error(dir / "missing.safetensors", "no such file or directory");

  // A good file cut anywhere is an error, never a crash or a partial read.
  const fs::path good = dir / "good.safetensors";
  write_safetensors(good.string(), {{"a", at::randn({8, 8})}, {"b", at::randn({5}).to(at::kBFloat16)}});
  const std::string bytes = read_bytes(good);
  for (size_t cut = 0; cut < bytes.size(); cut += 7) {
    write_bytes(dir / "cut.safetensors", bytes.substr(0, cut));
    EXPECT_NE(open_error(dir / "cut.safetensors"), "(no error)") << "cut at " << cut;
  }
}

TEST(Safetensors, DtypesWithoutAScalarTypeExposeBytes) {
  const fs::path path = raw_file(scratch_dir("u16") / "u16.safetensors",
                                 R"({"u":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})",
                                 std::string("\x01\x00\xff\xff", 4));
  const SafetensorsFile file(path.string());
  EXPECT_EQ(file.info("u").dtype_name, "U16");
  EXPECT_EQ(file.info("u").dtype, at::ScalarType::Undefined);
  EXPECT_EQ(file.bytes("u").second, 4u);
  try {
    file.tensor("u");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'u' has dtype U16"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, WriterRejectsBadInput) {
  const fs::path dir = scratch_dir("writer");
  const auto expect_error = [](const std::function<void()>& write, const std::string& problem) {
    try {
      write();
      ADD_FAILURE() << "no error; wanted " << problem;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(problem), std::string::npos) << e.what();
    }
  };
  const std::string path = (dir / "out.safetensors").string();
  expect_error(
      [&] {
        write_safetensors(path, {{"a", at::ones({2})}, {"a", at::ones({2})}});
      },
      "'a' appears twice");
  expect_error([&] { write_safetensors(path, {{"__metadata__", at::ones({2})}}); }, "cannot name a tensor");
  expect_error([&] { write_safetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}}); }, "tensor 'c'");
  expect_error(
      [&] {
        write_safetensors((dir / "no-such-dir" / "x.safetensors").string(), {{"a", at::ones({2})}});
      },
      "cannot create");
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // Rewriting replaces the file whole.
  write_safetensors(path, {{"a", at::ones({2})}});
  write_safetensors(path, {{"b", at::zeros({3})}});
  const SafetensorsFile file(path);
  EXPECT_EQ(file.names(), std::vector<std::string>{"b"});
}

TEST(SafetensorsIndex, ReadsShardedAndSingleFileDirectories) {
  const fs::path dir = scratch_dir("sharded");
  const at::Tensor a = at::randn({4, 4}), b = at::randn({4}), c = at::randn({2, 2}).to(at::kBFloat16);
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(), {{"a", a}, {"b", b}});
  write_safetensors((dir / "model-00002-of-00002.safetensors").string(), {{"c", c}});
  write_bytes(dir / "model.safetensors.index.json", json({{"metadata", {{"total_size", 84}}},
                                                          {"weight_map",
                                                           {{"a", "model-00001-of-00002.safetensors"},
                                                            {"b", "model-00001-of-00002.safetensors"},
                                                            {"c", "model-00002-of-00002.safetensors"}}}})
                                                        .dump());
  const SafetensorsIndex index(dir.string());
  EXPECT_EQ(index.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(index.shards().size(), 2u);
  EXPECT_TRUE(at::equal(index.tensor("a"), a));
  EXPECT_TRUE(at::equal(index.tensor("c"), c));
  EXPECT_EQ(index.info("c").dtype, at::kBFloat16);
  EXPECT_NE(index.file_of("c").path().find("model-00002-of-00002"), std::string::npos);
  EXPECT_THROW(index.tensor("d"), std::out_of_range);

  const fs::path single = scratch_dir("single");
  write_safetensors((single / "model.safetensors").string(), {{"x", a}});
  const SafetensorsIndex one(single.string());
  EXPECT_EQ(one.names(), std::vector<std::string>{"x"});
  EXPECT_TRUE(at::equal(one.tensor("x"), a));
  EXPECT_EQ(SafetensorsIndex((single / "model.safetensors").string()).names(), std::vector<std::string>{"x"});
}

TEST(SafetensorsIndex, MissingShardOrTensorGivesClearErrors) {
  const fs::path dir = scratch_dir("bad-index");
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(), {{"a", at::ones({2})}});
  const auto index_error = [&](const json& index) {
    write_bytes(dir / "model.safetensors.index.json", index.dump());
    try {
      SafetensorsIndex i(dir.string());
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string error =
      index_error({{"weight_map",
                    {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}}}});
  EXPECT_NE(error.find("model.safetensors.index.json"), std::string::npos) << error;
  EXPECT_NE(error.find("shard 'model-00002-of-00002.safetensors' (holding tensor 'b') is missing"),
            std::string::npos)
      << error;
  error = index_error({{"weight_map", {{"z", "model-00001-of-00002.safetensors"}}}});
  EXPECT_NE(error.find(
                "tensor 'z' is mapped to shard 'model-00001-of-00002.safetensors', which has no such tensor"),
            std::string::npos)
      << error;
  error = index_error({{"no_weight_map", 1}});
  EXPECT_NE(error.find("no \"weight_map\" object"), std::string::npos) << error;

  write_bytes(dir / "model.safetensors.index.json", "{not json");
  try {
    SafetensorsIndex i(dir.string());
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }

  const fs::path empty = scratch_dir("empty-dir");
  try {
    SafetensorsIndex i(empty.string());
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no model.safetensors or model.safetensors.index.json"),
              std::string::npos)
        << e.what();
  }
}

// A FIFO or a directory where a weights file or an index should be: refused at once
// naming it (a FIFO used to block the open forever); each call is bounded.
TEST(SafetensorsIndex, FifoOrDirectoryAsAWeightsFileIsRefusedPromptly) {
  using zenflow::test_support::call_within;
  using zenflow::test_support::make_fifo;
  const auto expect_refused = [](const fs::path& named, const std::string& open, const std::string& problem) {
    const auto o = call_within([open] { SafetensorsIndex i(open); });
    ASSERT_TRUE(o.returned) << o.message;
    EXPECT_TRUE(o.input_error) << o.message;
    EXPECT_EQ(o.message, named.string() + ": " + problem);
  };
  const fs::path dir = scratch_dir("fifo-weights");
  ASSERT_EQ(make_fifo(dir / "model.safetensors"), "");
  expect_refused(dir / "model.safetensors", dir.string(), "is a FIFO, expected a regular file");
  expect_refused(dir / "model.safetensors", (dir / "model.safetensors").string(),
                 "is a FIFO, expected a regular file");
  const auto o = call_within([p = (dir / "model.safetensors").string()] { SafetensorsFile f(p); });
  ASSERT_TRUE(o.returned) << o.message;
  EXPECT_EQ(o.message, (dir / "model.safetensors").string() + ": is a FIFO, expected a regular file");

  const fs::path index_dir = scratch_dir("fifo-index");
  ASSERT_EQ(make_fifo(index_dir / "model.safetensors.index.json"), "");
  expect_refused(index_dir / "model.safetensors.index.json", index_dir.string(),
                 "is a FIFO, expected a regular file");

  // A shard that is a FIFO, named by a good index.
  const fs::path shard_dir = scratch_dir("fifo-shard");
  ASSERT_EQ(make_fifo(shard_dir / "model-00001-of-00001.safetensors"), "");
  write_bytes(shard_dir / "model.safetensors.index.json",
              json({{"weight_map", {{"a", "model-00001-of-00001.safetensors"}}}}).dump());
  expect_refused(shard_dir / "model-00001-of-00001.safetensors", shard_dir.string(),
                 "is a FIFO, expected a regular file");

  const fs::path dir_dir = scratch_dir("dir-weights");
  fs::create_directories(dir_dir / "model.safetensors");
  expect_refused(dir_dir / "model.safetensors", dir_dir.string(), "is a directory, expected a regular file");
}

// Every file an index names must stay inside its directory: a weight_map entry naming
// ../outside.safetensors or /etc/passwd is refused naming the index and the entry, before
// that file is opened.
TEST(SafetensorsIndex, ShardNamesThatLeaveTheDirectoryAreRefused) {
  const fs::path root = scratch_dir("escape");
  const fs::path dir = root / "model";
  fs::create_directories(dir / "sub");
  // Real safetensors files at the escaping paths, so that only the name check can stop them.
  write_safetensors((root / "outside.safetensors").string(), {{"a", at::ones({2})}});
  write_safetensors((dir / "inside.safetensors").string(), {{"a", at::ones({2})}});
  const fs::path index = dir / "model.safetensors.index.json";
  const auto index_error = [&](const std::string& shard) {
    write_bytes(index, json({{"weight_map", {{"a", shard}}}}).dump());
    try {
      SafetensorsIndex i(dir.string());
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::pair<std::string, std::string> bad[] = {
      {"../outside.safetensors", "has a '..' component"},
      {"sub/../../outside.safetensors", "has a '..' component"},
      {"/etc/passwd", "is an absolute path"},
      {(root / "outside.safetensors").string(), "is an absolute path"},
      {"", "is empty"},
  };
  for (const auto& [shard, why] : bad) {
    const std::string error = index_error(shard);
    EXPECT_EQ(error, index.string() + ": weight_map[\"a\"] = " + json(shard).dump() + " " + why +
                         "; a shard must be a file inside the model directory");
  }
  // Names that stay inside are fine, through a subdirectory or a symlink (the Hugging Face
  // cache links every file of a snapshot to a blob outside it).
  EXPECT_EQ(index_error("inside.safetensors"), "(no error)");
  EXPECT_EQ(index_error("./inside.safetensors"), "(no error)");
  fs::copy_file(dir / "inside.safetensors", dir / "sub" / "nested.safetensors");
  EXPECT_EQ(index_error("sub/nested.safetensors"), "(no error)");
  fs::create_symlink(root / "outside.safetensors", dir / "linked.safetensors");
  EXPECT_EQ(index_error("linked.safetensors"), "(no error)");
}
