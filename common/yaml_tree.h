// A YAML document as a plain tree of text, read with libyaml: what the job spec validator
// walks. Scalars stay text (the validator decides what a number or a boolean is), so the
// only typing done here is YAML's null: a plain, untagged "", "~", "null", "Null" or
// "NULL". Aliases are expanded into copies. yaml-cpp built the same tree at about ten
// times the cost (60 us for a small spec, most of a SubmitJob's parse on the coordinator).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace zenflow::yaml {

// Malformed YAML, or a document past the limits below. what() is "line L, column C:
// <libyaml's problem>" when the position is known (both 1-based).
class ParseError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A hostile document cannot make the tree large or deep: aliases are copied, so a
// "billion laughs" document would otherwise grow exponentially, and the tree's
// destructor recurses once per level.
inline constexpr std::size_t kMaxNodes = 1 << 20;
inline constexpr int kMaxDepth = 128;

// One node. Maps keep their entries in document order, repeated keys included (the
// validator reports those).
class Node {
 public:
  enum class Type { kNull, kScalar, kSequence, kMap };

  Node() = default;
  static Node scalar(std::string text);
  static Node map();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_scalar() const { return type_ == Type::kScalar; }
  bool is_sequence() const { return type_ == Type::kSequence; }
  bool is_map() const { return type_ == Type::kMap; }

  // The text of a scalar; "" for anything else.
  const std::string& text() const { return text_; }
  // Items of a sequence, or entries of a map; 0 for a scalar or null.
  std::size_t size() const { return is_map() ? children_.size() / 2 : children_.size(); }
  // Sequence item i (i < size()).
  const Node& item(std::size_t i) const { return children_[i]; }
  // Map entry i's key and value (i < size()).
  const Node& key(std::size_t i) const { return children_[2 * i]; }
  const Node& value(std::size_t i) const { return children_[2 * i + 1]; }

  // The value of the first entry whose key is the scalar `k`, or nullptr (maps only).
  const Node* find(std::string_view k) const;
  // For maps: the value under `k` (the first entry's, as find), appended as null when absent.
  Node& set(std::string_view k);

 private:
  friend class TreeBuilder;
  Type type_ = Type::kNull;
  std::string text_;
  std::vector<Node> children_;  // a map's as key, value, key, value, …
};

// The first document of `text` (a null node for an empty text). Throws ParseError on
// malformed YAML, a second document, or a document past kMaxNodes or kMaxDepth.
Node parse(std::string_view text);

}  // namespace zenflow::yaml
