// The project's documents as a reader gets them from a clone: every relative link in
// README.md and docs/*.md resolves to a file or directory of the repository, and none of
// them points outside it (a note beside the checkout that users of the project do not have).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
const fs::path kSourceDir = ZENFLOW_SOURCE_DIR;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Link {
  std::string target;
  int line = 0;
};

// The targets of the markdown links `[text](target)` outside code (``` blocks and `spans`).
std::vector<Link> links_in(const std::string& text) {
  std::vector<Link> out;
  bool fenced = false;
  int line_no = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.rfind("```", 0) == 0) {
      fenced = !fenced;
      continue;
    }
    if (fenced) continue;
    bool code = false;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '`') code = !code;
      if (code || line[i] != ']' || i + 1 >= line.size() || line[i + 1] != '(') continue;
      const size_t end = line.find(')', i + 2);
      if (end == std::string::npos) continue;
      out.push_back({line.substr(i + 2, end - i - 2), line_no});
      i = end;
    }
  }
  return out;
}

bool external(const std::string& target) {
  return target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0 || target.rfind("mailto:", 0) == 0;
}

std::vector<fs::path> documents() {
  std::vector<fs::path> docs = {kSourceDir / "README.md"};
  for (const auto& e : fs::recursive_directory_iterator(kSourceDir / "docs"))
    if (e.is_regular_file() && e.path().extension() == ".md") docs.push_back(e.path());
  return docs;
}

TEST(Docs, EveryRelativeLinkInTheReadmeAndDocsResolvesInsideTheRepository) {
  const fs::path root = fs::weakly_canonical(kSourceDir);
  int checked = 0;
  for (const fs::path& doc : documents()) {
    for (const Link& link : links_in(read(doc))) {
      if (external(link.target) || link.target.empty() || link.target[0] == '#') continue;
      const std::string path = link.target.substr(0, link.target.find('#'));
      const fs::path resolved = fs::weakly_canonical(doc.parent_path() / path);
      const std::string where = fs::relative(doc, kSourceDir).string() + ":" + std::to_string(link.line) + ": " +
                                link.target;
      EXPECT_TRUE(fs::exists(resolved)) << where << " does not exist";
      const std::string rel = fs::relative(resolved, root).string();
      EXPECT_FALSE(rel.empty() || rel.rfind("..", 0) == 0) << where << " points outside the repository";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "no relative link found: the parser is broken";
}

// The parser itself: links in text count, links in code do not.
TEST(Docs, LinksAreReadFromTextNotFromCode) {
  const std::vector<Link> found =
      links_in("see [a](docs/a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d](https://x.org) [e](../e.md#top)\n");
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].target, "docs/a.md");
  EXPECT_EQ(found[1].target, "https://x.org");
  EXPECT_EQ(found[2].target, "../e.md#top");
  EXPECT_EQ(found[2].line, 5);
}

}  // namespace
