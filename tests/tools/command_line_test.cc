// The subcommands' argument reader: options with values given both ways,
// counts checked, the rest after "--", and the errors every command shares.
#include "tools/command_line.h"

#include <gtest/gtest.h>

#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::ErrorOf;

TEST(CommandLine, ReadsOptionsValuesAndPositionalsInOrder) {
  CommandLine cmd({"--set", "a=1", "--set=b=2", "run.yaml", "-o", "out", "--top", "3", "--ema"});
  std::vector<std::string> sets;
  std::string config, out;
  int64_t top = 0;
  bool ema = false;
  while (cmd.Next()) {
    if (cmd.Is("--set")) {
      sets.push_back(cmd.Value());
    } else if (cmd.Is("-o", "--out")) {
      out = cmd.Value();
    } else if (cmd.Is("--top")) {
      top = cmd.Count();
    } else if (cmd.Is("--ema")) {
      ema = true;
    } else if (!cmd.IsOption() && config.empty()) {
      config = cmd.arg();
    } else {
      cmd.Reject();
    }
  }
  EXPECT_EQ(sets, (std::vector<std::string>{"a=1", "b=2"}));
  EXPECT_EQ(config, "run.yaml");
  EXPECT_EQ(out, "out");
  EXPECT_EQ(top, 3);
  EXPECT_TRUE(ema);
}

// Runs `read` over args until it throws; the message.
template <typename Fn>
std::string FirstError(std::vector<std::string> args, Fn read) {
  return ErrorOf<UsageError>([&] {
    CommandLine cmd(std::move(args));
    while (cmd.Next()) read(cmd);
  });
}

TEST(CommandLine, SaysWhatIsWrongWithAnArgument) {
  auto counts = [](CommandLine& c) {
    if (c.Is("--top")) return (void)c.Count();
    if (c.Is("--flag")) return;
    if (c.Is("--list")) return (void)c.CountList();
    if (c.Is("--wait")) return (void)c.Seconds();
    c.Reject();
  };
  EXPECT_EQ(FirstError({"--top"}, counts), "--top needs a value");
  EXPECT_EQ(FirstError({"--top", "0"}, counts), "--top needs a whole number >= 1, got '0'");
  EXPECT_EQ(FirstError({"--top=2x"}, counts), "--top needs a whole number >= 1, got '2x'");
  EXPECT_EQ(FirstError({"--flag=1"}, counts), "--flag takes no value, got '1'");
  EXPECT_EQ(FirstError({"--list", "1,,2"}, counts), "--list needs a whole number >= 1, got ''");
  EXPECT_EQ(FirstError({"--wait", "-1"}, counts), "--wait needs seconds > 0, got '-1'");
  EXPECT_EQ(FirstError({"--bogus"}, counts), "unknown option '--bogus'");
  EXPECT_EQ(FirstError({"stray"}, counts), "unexpected argument 'stray'");
}

TEST(CommandLine, RestIsWhatFollowsTheCurrentArgument) {
  CommandLine cmd({"-n", "2", "--", "cnnflow", "train", "--set=x=1"});
  std::vector<std::string> rest;
  while (cmd.Next()) {
    if (cmd.Is("-n")) {
      EXPECT_EQ(cmd.Count(), 2);
    } else if (cmd.Is("--")) {
      rest = cmd.Rest();
      break;
    }
  }
  EXPECT_EQ(rest, (std::vector<std::string>{"cnnflow", "train", "--set=x=1"}));
}

}  // namespace
}  // namespace cnnflow
