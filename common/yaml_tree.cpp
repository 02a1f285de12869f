// libyaml's events, composed into a yaml::Node tree.
#include "common/yaml_tree.h"

#include <yaml.h>

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

namespace zenflow::yaml {
namespace {

std::string at(const yaml_mark_t& m) {
  return "line " + std::to_string(m.line + 1) + ", column " + std::to_string(m.column + 1);
}

bool plain_null(const yaml_event_t& e) {
  if (e.data.scalar.style != YAML_PLAIN_SCALAR_STYLE || e.data.scalar.tag != nullptr) return false;
  const std::string_view v(reinterpret_cast<const char*>(e.data.scalar.value), e.data.scalar.length);
  return v.empty() || v == "~" || v == "null" || v == "Null" || v == "NULL";
}

std::string anchor_of(const yaml_char_t* anchor) {
  return anchor ? reinterpret_cast<const char*>(anchor) : "";
}

}  // namespace

Node Node::scalar(std::string text) {
  Node n;
  n.type_ = Type::kScalar;
  n.text_ = std::move(text);
  return n;
}

Node Node::map() {
  Node n;
  n.type_ = Type::kMap;
  return n;
}

const Node* Node::find(std::string_view k) const {
  if (!is_map()) return nullptr;
  for (std::size_t i = 0; i < size(); ++i)
    if (key(i).is_scalar() && key(i).text() == k) return &value(i);
  return nullptr;
}

Node& Node::set(std::string_view k) {
  if (!is_map()) throw std::logic_error("yaml::Node::set on a node that is not a map");
  for (std::size_t i = 0; i < size(); ++i)
    if (children_[2 * i].is_scalar() && children_[2 * i].text() == k) return children_[2 * i + 1];
  children_.push_back(scalar(std::string(k)));
  children_.emplace_back();
  return children_.back();
}

// Adds each value event's node where the document puts it: the root, the next item of the
// open sequence, or the next key or value of the open map. An open container is always
// the last child of its parent, and its parent gains no child while it is open, so the
// pointers on the stack stay valid.
class TreeBuilder {
 public:
  Node take() { return std::move(root_); }
  bool done() const { return has_root_ && open_.empty(); }

  void scalar(const yaml_event_t& e) {
    Node n = plain_null(e) ? Node()
                           : Node::scalar(std::string(reinterpret_cast<const char*>(e.data.scalar.value),
                                                      e.data.scalar.length));
    Node& placed = place(std::move(n), 1, 0, e.start_mark);
    remember(e.data.scalar.anchor, placed, e.start_mark);
  }

  void open(const yaml_event_t& e, Node::Type type) {
    Node n;
    n.type_ = type;
    Node& placed = place(std::move(n), 1, 0, e.start_mark);
    const yaml_char_t* anchor =
        type == Node::Type::kMap ? e.data.mapping_start.anchor : e.data.sequence_start.anchor;
    open_.push_back({&placed, anchor_of(anchor), nodes_});
    if (static_cast<int>(open_.size()) > kMaxDepth)
      throw ParseError(at(e.start_mark) + ": nested deeper than " + std::to_string(kMaxDepth) + " levels");
  }

  void close(const yaml_event_t& e) {
    Open o = open_.back();
    open_.pop_back();
    if (!o.anchor.empty()) {  // kept as a copy, which counts as nodes built
      const std::size_t nodes = nodes_ - o.nodes_before + 1;
      charge(nodes, e.start_mark);
      int depth = 0;
      measure(*o.node, 1, &depth);
      anchors_[o.anchor] = {*o.node, nodes, depth};
    }
  }

  void alias(const yaml_event_t& e) {
    const std::string name = anchor_of(e.data.alias.anchor);
    auto it = anchors_.find(name);
    if (it == anchors_.end())
      throw ParseError(at(e.start_mark) + ": alias *" + name + " names no anchor defined before it");
    place(Node(it->second.node), it->second.nodes, it->second.depth - 1, e.start_mark);
  }

 private:
  struct Open {
    Node* node;
    std::string anchor;
    std::size_t nodes_before;  // nodes_ when it opened
  };
  struct Anchored {
    Node node;
    std::size_t nodes;
    int depth;  // levels, the node's own included
  };

  static void measure(const Node& n, int level, int* depth) {
    *depth = std::max(*depth, level);
    for (const Node& c : n.children_) measure(c, level + 1, depth);
  }

  void charge(std::size_t nodes, const yaml_mark_t& mark) {
    nodes_ += nodes;
    if (nodes_ > kMaxNodes)
      throw ParseError(at(mark) + ": more than " + std::to_string(kMaxNodes) +
                       " nodes (an alias counts its anchor's nodes at every use)");
  }

  Node& place(Node n, std::size_t nodes, int extra_depth, const yaml_mark_t& mark) {
    charge(nodes, mark);
    if (static_cast<int>(open_.size()) + 1 + extra_depth > kMaxDepth)
      throw ParseError(at(mark) + ": nested deeper than " + std::to_string(kMaxDepth) + " levels");
    if (open_.empty()) {
      root_ = std::move(n);
      has_root_ = true;
      return root_;
    }
    std::vector<Node>& siblings = open_.back().node->children_;
    siblings.push_back(std::move(n));
    return siblings.back();
  }

  void remember(const yaml_char_t* anchor, const Node& n, const yaml_mark_t& mark) {
    if (!anchor) return;
    charge(1, mark);
    anchors_[anchor_of(anchor)] = {n, 1, 1};
  }

  Node root_;
  bool has_root_ = false;
  std::vector<Open> open_;
  std::map<std::string, Anchored> anchors_;
  std::size_t nodes_ = 0;
};

Node parse(std::string_view text) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) throw std::bad_alloc();
  std::unique_ptr<yaml_parser_t, void (*)(yaml_parser_t*)> owned(&parser, yaml_parser_delete);
  yaml_parser_set_input_string(&parser, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  TreeBuilder tree;
  int documents = 0;
  for (;;) {
    yaml_event_t e;
    if (!yaml_parser_parse(&parser, &e)) {
      std::string what = at(parser.problem_mark) + ": " + (parser.problem ? parser.problem : "malformed YAML");
      if (parser.context)
        what += std::string(" (") + parser.context + " at " + at(parser.context_mark) + ")";
      throw ParseError(what);
    }
    std::unique_ptr<yaml_event_t, void (*)(yaml_event_t*)> event(&e, yaml_event_delete);
    switch (e.type) {
      case YAML_STREAM_END_EVENT:
        return tree.take();
      case YAML_DOCUMENT_START_EVENT:
        if (++documents > 1)
          throw ParseError(at(e.start_mark) + ": a second YAML document (a job spec is one document)");
        break;
      case YAML_SCALAR_EVENT:
        tree.scalar(e);
        break;
      case YAML_SEQUENCE_START_EVENT:
        tree.open(e, Node::Type::kSequence);
        break;
      case YAML_MAPPING_START_EVENT:
        tree.open(e, Node::Type::kMap);
        break;
      case YAML_SEQUENCE_END_EVENT:
      case YAML_MAPPING_END_EVENT:
        tree.close(e);
        break;
      case YAML_ALIAS_EVENT:
        tree.alias(e);
        break;
      default:  // stream start, document end, no event
        break;
    }
  }
}

}  // namespace zenflow::yaml
