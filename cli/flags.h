// A small command-line flag parser for the kvpage CLI's subcommands.
//
// Accepts "--name value" and "--name=value"; boolean flags take no value. Every error names
// the flag and the bad value. Registered destinations must outlive Parse().
#ifndef KVPAGE_CLI_FLAGS_H_
#define KVPAGE_CLI_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvpage::cli {

class FlagSet {
 public:
  explicit FlagSet(std::string usage) : usage_(std::move(usage)) {}

  void String(std::string name, std::string* dst, std::string help);
  void Int(std::string name, int64_t* dst, std::string help);
  void Double(std::string name, double* dst, std::string help);
  void Bool(std::string name, bool* dst, std::string help);  // present = true

  // Parses args (without the program and subcommand names). Sets *help_requested on -h/--help.
  absl::Status Parse(const std::vector<std::string>& args, bool* help_requested);
  // Whether the flag appeared on the command line (after Parse).
  bool WasSet(const std::string& name) const;
  std::string Help() const;

 private:
  enum class Type { kString, kInt, kDouble, kBool };
  struct Flag {
    std::string name;
    Type type;
    void* dst;
    std::string help;
    bool set = false;
  };
  Flag* Find(const std::string& name);
  absl::Status Assign(Flag& flag, const std::string& value);

  std::string usage_;
  std::vector<Flag> flags_;
};

// "32768", "32k", "32K" (× 1024), "1M" (× 2^20). InvalidArgument naming `flag` otherwise.
absl::Status ParseTokenCount(const std::string& flag, const std::string& text, int64_t* out);
// Comma-separated list of token counts.
absl::Status ParseTokenCountList(const std::string& flag, const std::string& text,
                                 std::vector<int64_t>* out);

}  // namespace kvpage::cli

#endif  // KVPAGE_CLI_FLAGS_H_
