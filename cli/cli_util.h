// Pieces the kvpage CLI's subcommands share: flag parsing with --help and usage errors, and
// running the bundled plotting scripts.
#ifndef KVPAGE_CLI_CLI_UTIL_H_
#define KVPAGE_CLI_CLI_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cli/flags.h"

namespace kvpage::cli {

// Prints "kvpage <command>: <message>" to stderr; returns 2 (bad usage or bad input).
int FailUsage(const char* command, const absl::Status& status);

// Parses args into fs. Returns true when the command should go on; otherwise it printed the
// help (*exit_code = 0) or the bad flag (*exit_code = 2).
bool ParseFlagsOrExit(FlagSet& fs, const std::vector<std::string>& args, const char* command,
                      int* exit_code);

// The directory of the CLI's run-time files: scripts/ (the plot scripts), traces/, models/ and
// hardware/. $KVPAGE_DATA_DIR when set; otherwise KVPAGE_DATA_RELATIVE_DIR (normally
// ../share/kvpage) from the directory of the running binary, which is where `cmake --install`
// puts them and where the build tree links them, so an installed kvpage keeps working after
// the source tree moves.
std::string DataDir();

// 'text' for a POSIX shell.
std::string ShellQuote(const std::string& text);

// Runs `script` (a path) with `quoted_args` under /usr/bin/python3 (or python3 on the PATH).
// Prints "kvpage <command>: plotting failed (...)" and returns false if it fails.
bool RunPlotScript(const char* command, const std::string& script, const std::string& quoted_args);

// Writes `json` next to `png` (png + ".json"), runs `script --input JSON --output PNG` and
// removes the JSON. Returns the exit code: 0 after "kvpage <command>: wrote PNG" on stderr,
// 1 after a message when the file cannot be written or the script fails.
int PlotJson(const char* command, const std::string& script, const std::string& json,
             const std::string& png);

}  // namespace kvpage::cli

#endif  // KVPAGE_CLI_CLI_UTIL_H_
