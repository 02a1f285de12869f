// The project's documents as a reader gets them from a clone: every relative link in
// README.md and docs/*.md resolves to a file or directory of the repository (and a link to a
// section, to a heading of that file), none of them points outside it (a note beside the
// checkout that users of the project do not have), the README links every page of docs/,
// and no file of the repository cites the design notes that lived outside it.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
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

// GitHub's anchor of a heading: lower case, spaces to '-', other punctuation dropped (so
// "## 9.1 Rules, and more" is "#91-rules-and-more"). Non-ASCII characters are dropped too,
// which is what GitHub does with the punctuation this project's headings use (— §).
std::string anchor_of(const std::string& heading) {
  std::string out;
  for (unsigned char c : heading) {
    if (std::isalnum(c))
      out += static_cast<char>(std::tolower(c));
    else if (c == ' ')
      out += '-';
    else if (c == '-' || c == '_')
      out += static_cast<char>(c);
  }
  return out;
}

// The anchors of a markdown file's headings (outside ``` blocks).
std::set<std::string> anchors_in(const std::string& text) {
  std::set<std::string> out;
  bool fenced = false;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (fenced || line.empty() || line[0] != '#') continue;
    const size_t start = line.find_first_not_of('#');
    if (start == std::string::npos || line[start] != ' ') continue;
    out.insert(anchor_of(line.substr(start + 1)));
  }
  return out;
}

TEST(Docs, EveryLinkToASectionNamesAHeadingOfItsFile) {
  int checked = 0;
  for (const fs::path& doc : documents()) {
    for (const Link& link : links_in(read(doc))) {
      const size_t hash = link.target.find('#');
      if (external(link.target) || hash == std::string::npos) continue;
      const std::string file = link.target.substr(0, hash), anchor = link.target.substr(hash + 1);
      const fs::path target = file.empty() ? doc : doc.parent_path() / file;
      if (target.extension() != ".md" || !fs::is_regular_file(target)) continue;
      EXPECT_EQ(anchors_in(read(target)).count(anchor), 1u)
          << fs::relative(doc, kSourceDir).string() << ":" << link.line << ": " << link.target
          << ": no heading of " << fs::relative(target, kSourceDir).string() << " has that anchor";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "no link to a section found: the parser is broken";
}

TEST(Docs, AnchorsFollowGithub) {
  EXPECT_EQ(anchor_of("9.1 Scheduler rules, and the failures they prevent"),
            "91-scheduler-rules-and-the-failures-they-prevent");
  EXPECT_EQ(anchor_of("5. The store: durability and backups"), "5-the-store-durability-and-backups");
  EXPECT_EQ(anchor_of("Remote optimizer nodes (UCX): `zenflow-optimizer`"),
            "remote-optimizer-nodes-ucx-zenflow-optimizer");
  EXPECT_EQ(anchors_in("# a\n```\n# not a heading\n```\n#nospace\n## B c\n"),
            (std::set<std::string>{"a", "b-c"}));
}

// The README is where a reader starts: it links every page of docs/.
TEST(Docs, TheReadmeLinksEveryPageOfDocs) {
  std::set<std::string> linked;
  for (const Link& link : links_in(read(kSourceDir / "README.md")))
    linked.insert(link.target.substr(0, link.target.find('#')));
  int pages = 0;
  for (const auto& e : fs::directory_iterator(kSourceDir / "docs")) {
    if (!e.is_regular_file() || e.path().extension() != ".md") continue;
    const std::string page = "docs/" + e.path().filename().string();
    EXPECT_EQ(linked.count(page), 1u) << "README.md does not link " << page;
    ++pages;
  }
  for (const char* page : {"docs/design.md", "docs/semantics.md", "docs/operations.md", "docs/security.md",
                           "docs/reliability.md", "docs/troubleshooting.md", "docs/benchmarks.md"})
    EXPECT_TRUE(fs::is_regular_file(kSourceDir / page)) << page << " is missing";
  EXPECT_GE(pages, 7);
}

// What cites the design notes that lived beside the checkout, outside the repository. The
// names are spelled in pieces so that this file does not cite them itself.
const std::vector<std::string>& outside_notes() {
  static const std::vector<std::string> names = {
      std::string("DESIGN") + ".md",           std::string("STYLE") + ".md",
      std::string("zenflow") + "-semantics",   std::string("pricing") + "-notes",
      std::string("control-plane") + "-notes", std::string("host-performance") + "-notes",
      std::string("deploy") + "-notes",        std::string("advisor") + "-notes",
      std::string("ucx-optimizer") + "-nodes", std::string("seed") + "-zenflow",
      std::string("../sha") + "red/",          std::string("/work/") + "shared"};
  return names;
}

// The names of outside_notes() that `text` cites.
std::vector<std::string> outside_citations(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& name : outside_notes())
    if (text.find(name) != std::string::npos) out.push_back(name);
  return out;
}

// The repository's files, relative to its root: what git tracks when the source dir is a
// checkout, else every file below it except build trees and hidden directories.
std::vector<std::string> repository_files() {
  std::vector<std::string> files;
  const std::string command = "git -C '" + kSourceDir.string() + "' ls-files -z 2>/dev/null";
  if (FILE* pipe = popen(command.c_str(), "r")) {
    std::string name;
    for (int c; (c = std::fgetc(pipe)) != EOF;) {
      if (c != 0) {
        name += static_cast<char>(c);
      } else {
        files.push_back(name);
        name.clear();
      }
    }
    if (pclose(pipe) == 0 && !files.empty()) return files;
    files.clear();
  }
  for (auto it = fs::recursive_directory_iterator(kSourceDir); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string leaf = it->path().filename().string();
    if (it->is_directory() &&
        (leaf.rfind(".", 0) == 0 || leaf.rfind("build", 0) == 0 || leaf == "node_modules")) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(fs::relative(it->path(), kSourceDir).string());
  }
  return files;
}

TEST(Docs, NoFileOfTheRepositoryCitesNotesOutsideIt) {
  const std::vector<std::string> files = repository_files();
  ASSERT_GT(files.size(), 100u) << "the repository's files were not found under " << kSourceDir;
  for (const std::string& file : files) {
    const fs::path path = kSourceDir / file;
    if (!fs::is_regular_file(path)) continue;
    const std::string text = read(path);
    if (text.find('\0') != std::string::npos) continue;  // binary
    const std::vector<std::string> cited = outside_citations(text);
    if (cited.empty()) continue;
    std::string names;
    for (const std::string& n : cited) names += (names.empty() ? "" : ", ") + n;
    ADD_FAILURE() << file << " cites " << names
                  << ", outside the repository: cite the docs/ page that holds the fact instead";
  }
}

TEST(Docs, OutsideCitationsAreFoundAndDocsPathsAreNot) {
  EXPECT_EQ(outside_citations("// see " + std::string("reference/zenflow") + "-semantics.md §4").size(), 1u);
  EXPECT_EQ(outside_citations("(" + std::string("DESIGN") + ".md §7)").size(), 1u);
  EXPECT_EQ(outside_citations("[x](" + std::string("../sha") + "red/x.md)").size(), 1u);
  EXPECT_TRUE(outside_citations("// docs/semantics.md §4, docs/design.md §7, /shared volume").empty());
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
