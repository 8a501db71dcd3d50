#include "tools/hosts.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "ops/error.h"

namespace cnnflow {
namespace {

// A list that expands past this is a typo ("node[1-1000000]"), not a cluster.
constexpr size_t kMaxHosts = 100000;

// A count >= 1 of decimal digits only, or -1.
long ParseSlots(const std::string& v) {
  if (v.empty() || v.size() > 9) return -1;
  for (const char c : v) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  }
  const long n = std::strtol(v.c_str(), nullptr, 10);
  return n >= 1 ? n : -1;
}

// Fails unless every name is new; `where` says where each came from.
void CheckUnique(const std::vector<Host>& hosts, const std::vector<std::string>& where) {
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const auto [it, fresh] = seen.emplace(hosts[i].name, i);
    if (!fresh) {
      throw ConfigError(StrCat(where[i], ": host '", hosts[i].name, "' is listed twice (also ",
                               where[it->second], ")"));
    }
  }
}

class NodeListParser {
 public:
  NodeListParser(const std::string& list, const std::string& origin)
      : list_(list), origin_(origin) {}

  std::vector<std::string> Parse() {
    std::vector<std::string> names;
    size_t begin = 0;
    int depth = 0;
    for (size_t i = 0; i <= list_.size(); ++i) {
      const char c = i < list_.size() ? list_[i] : ',';
      if (c == '[') {
        if (depth++ > 0) Fail(i, "'[' inside brackets");
      } else if (c == ']') {
        if (depth-- == 0) Fail(i, "']' without '['");
      } else if (c == ',' && depth == 0) {
        if (i == begin) Fail(i, "empty name");
        for (auto& n : Expand(begin, i)) names.push_back(std::move(n));
        if (names.size() > kMaxHosts) Fail(i, StrCat("expands to over ", kMaxHosts, " names"));
        begin = i + 1;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        Fail(i, "a space");
      }
    }
    if (depth != 0) Fail(list_.rfind('['), "'[' without ']'");
    std::set<std::string> seen;
    for (const auto& n : names) {
      if (!seen.insert(n).second) {
        throw ConfigError(StrCat(origin_, "=\"", list_, "\": '", n, "' is listed twice"));
      }
    }
    return names;
  }

 private:
  [[noreturn]] void Fail(size_t at, const std::string& what) const {
    throw ConfigError(StrCat(origin_, "=\"", list_, "\": ", what, " at character ", at + 1,
                             " (expected names with bracketed ranges, e.g. node[01-04,07],gpu5)"));
  }

  // The names of list_[begin, end): one item, brackets balanced.
  std::vector<std::string> Expand(size_t begin, size_t end) const {
    std::vector<std::string> names = {""};
    size_t i = begin;
    while (i < end) {
      std::vector<std::string> parts;
      if (list_[i] == '[') {
        const size_t close = list_.find(']', i);
        parts = Ranges(i + 1, close);
        i = close + 1;
      } else {
        const size_t open = std::min(list_.find('[', i), end);
        parts = {list_.substr(i, open - i)};
        i = open;
      }
      std::vector<std::string> next;
      for (const auto& n : names) {
        for (const auto& p : parts) next.push_back(n + p);
        if (next.size() > kMaxHosts) Fail(begin, StrCat("expands to over ", kMaxHosts, " names"));
      }
      names = std::move(next);
    }
    return names;
  }

  // "01-03,7" between brackets (list_[begin, end)) -> 01 02 03 7.
  std::vector<std::string> Ranges(size_t begin, size_t end) const {
    std::vector<std::string> out;
    size_t i = begin;
    while (i <= end) {
      size_t comma = list_.find(',', i);
      if (comma == std::string::npos || comma > end) comma = end;
      const std::string range = list_.substr(i, comma - i);
      if (range.empty()) Fail(i, "an empty range");
      const size_t dash = range.find('-');
      const std::string lo = range.substr(0, dash);
      const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
      const auto digits = [](const std::string& s) {
        return !s.empty() && s.size() <= 9 &&
               s.find_first_not_of("0123456789") == std::string::npos;
      };
      if (!digits(lo) || !digits(hi)) {
        Fail(i, StrCat("range '", range, "' is not N or N-M of digits"));
      }
      const long a = std::strtol(lo.c_str(), nullptr, 10);
      const long b = std::strtol(hi.c_str(), nullptr, 10);
      if (a > b) Fail(i, StrCat("range '", range, "' runs backwards"));
      if (static_cast<size_t>(b - a) >= kMaxHosts) {
        Fail(i, StrCat("range '", range, "' expands to over ", kMaxHosts, " names"));
      }
      for (long v = a; v <= b; ++v) {
        std::string s = std::to_string(v);
        if (s.size() < lo.size()) s.insert(0, lo.size() - s.size(), '0');  // Slurm's padding
        out.push_back(std::move(s));
      }
      i = comma + 1;
    }
    return out;
  }

  const std::string& list_;
  const std::string& origin_;
};

}  // namespace

std::vector<std::string> ParseSlurmNodeList(const std::string& list, const std::string& origin) {
  return NodeListParser(list, origin).Parse();
}

std::vector<Host> ParseHostFile(const std::string& text, const std::string& origin) {
  std::vector<Host> hosts;
  std::vector<std::string> where;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string at = StrCat(origin, ":", number);
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    Host host;
    if (!(words >> host.name)) continue;  // blank or a comment
    for (std::string word; words >> word;) {
      const size_t eq = word.find('=');
      const std::string key = word.substr(0, eq),
                        value = eq == word.npos ? "" : word.substr(eq + 1);
      const long n = ParseSlots(value);
      if ((key != "slots" && key != "max_slots") || n < 1) {
        throw ConfigError(StrCat(at, ": '", word, "' is not slots=N or max_slots=N (N >= 1)",
                                 " (expected HOST [slots=N] [max_slots=N], # comments)"));
      }
      if (key == "slots") host.slots = static_cast<int>(n);
    }
    hosts.push_back(host);
    where.push_back(at);
  }
  if (hosts.empty()) throw ConfigError(StrCat(origin, ": no hosts (one host a line)"));
  CheckUnique(hosts, where);
  return hosts;
}

std::vector<Host> ReadHostFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw ConfigError(StrCat("--hostfile ", path, ": cannot be read"));
  std::stringstream text;
  text << file.rdbuf();
  return ParseHostFile(text.str(), path);
}

std::vector<Host> ParseHostList(const std::string& list) {
  std::vector<Host> hosts;
  std::vector<std::string> where;
  size_t begin = 0;
  for (int item = 1;; ++item) {
    const size_t comma = std::min(list.find(',', begin), list.size());
    const std::string word = list.substr(begin, comma - begin);
    const std::string at = StrCat("--hosts ", list, ": host ", item);
    const size_t colon = word.find(':');
    Host host{word.substr(0, colon), 0};
    if (colon != word.npos) {
      const long n = ParseSlots(word.substr(colon + 1));
      if (n < 1) throw ConfigError(StrCat(at, ": '", word, "' is not HOST or HOST:SLOTS"));
      host.slots = static_cast<int>(n);
    }
    if (host.name.empty() || host.name.find_first_of(" \t[]") != std::string::npos) {
      throw ConfigError(StrCat(at, ": '", word, "' is not a host name (expected a,b:2,c)"));
    }
    hosts.push_back(host);
    where.push_back(at);
    if (comma == list.size()) break;
    begin = comma + 1;
  }
  CheckUnique(hosts, where);
  return hosts;
}

}  // namespace cnnflow
