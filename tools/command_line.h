// A subcommand's arguments, read in order: the one loop every command's
// parser writes, with the same errors everywhere.
//
//   CommandLine cmd(args);
//   while (cmd.Next()) {
//     if (cmd.Is("--weights")) weights = cmd.Value();
//     else if (cmd.Is("-o", "--out")) out = cmd.Value();
//     else if (cmd.Is("--top")) top = cmd.Count();
//     else if (!cmd.IsOption() && config.empty()) config = cmd.arg();
//     else cmd.Reject();
//   }
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ops/error.h"

namespace cnnflow {

// A usage mistake: the command prints it (with its usage text) and exits 2.
struct UsageError : ConfigError {
  using ConfigError::ConfigError;
};

class CommandLine {
 public:
  explicit CommandLine(std::vector<std::string> args) : args_(std::move(args)) {}

  // Moves to the next argument; false past the last. "--opt=value" reads
  // as "--opt" given "value". Throws UsageError when the previous option
  // was given an "=value" it does not take.
  bool Next();
  // The current argument ("--opt" of "--opt=value").
  const std::string& arg() const { return arg_; }
  bool Is(std::string_view name) const { return arg_ == name; }
  bool Is(std::string_view name, std::string_view other) const {
    return arg_ == name || arg_ == other;
  }
  // Starts with '-' (and is not "-" alone, which names standard input).
  bool IsOption() const { return arg_.size() > 1 && arg_[0] == '-'; }

  // The current option's value: its "=value", else the next argument.
  std::string Value();
  // The value as a whole number >= min, else UsageError naming the option.
  int64_t Count(int64_t min = 1);
  // Comma-separated whole numbers >= min ("1,2,4").
  std::vector<int64_t> CountList(int64_t min = 1);
  // A number of seconds > 0.
  double Seconds();

  // The arguments after the current one (a command to run, after "--").
  std::vector<std::string> Rest() const { return {args_.begin() + next_, args_.end()}; }

  // Throws UsageError: "unknown option '--x'" or "unexpected argument 'x'".
  [[noreturn]] void Reject() const;

 private:
  std::vector<std::string> args_;
  size_t next_ = 0;
  std::string arg_;
  std::string inline_value_;
  bool has_inline_ = false;
};

}  // namespace cnnflow
