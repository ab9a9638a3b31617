#include "cli/cli_util.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace kvpage::cli {

int FailUsage(const char* command, const absl::Status& status) {
  std::cerr << "kvpage " << command << ": " << status.message() << "\n";
  return 2;
}

bool ParseFlagsOrExit(FlagSet& fs, const std::vector<std::string>& args, const char* command,
                      int* exit_code) {
  bool help = false;
  if (absl::Status s = fs.Parse(args, &help); !s.ok()) {
    *exit_code = FailUsage(command, s);
    return false;
  }
  if (help) {
    std::cout << fs.Help();
    *exit_code = 0;
    return false;
  }
  return true;
}

std::string DataDir() {
  if (const char* env = std::getenv("KVPAGE_DATA_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  // /proc/self/exe names the binary itself, not a link to it on the PATH.
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return KVPAGE_DATA_RELATIVE_DIR;
  return (exe.parent_path() / KVPAGE_DATA_RELATIVE_DIR).lexically_normal().string();
}

std::string ShellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool RunPlotScript(const char* command, const std::string& script, const std::string& quoted_args) {
  const std::string python =
      std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const std::string cmd = absl::StrCat(python, " ", ShellQuote(script), " ", quoted_args);
  if (std::system(cmd.c_str()) != 0) {
    std::cerr << "kvpage " << command << ": plotting failed (" << cmd << ")\n";
    return false;
  }
  return true;
}

int PlotJson(const char* command, const std::string& script, const std::string& json,
             const std::string& png) {
  const std::string json_path = png + ".json";
  {
    std::ofstream out(json_path);
    out << json;
    if (!out) {
      std::cerr << "kvpage " << command << ": cannot write " << json_path << "\n";
      return 1;
    }
  }
  const bool plotted = RunPlotScript(
      command, script,
      absl::StrCat("--input ", ShellQuote(json_path), " --output ", ShellQuote(png)));
  std::error_code ec;
  std::filesystem::remove(json_path, ec);
  if (!plotted) return 1;
  std::cerr << "kvpage " << command << ": wrote " << png << "\n";
  return 0;
}

}  // namespace kvpage::cli
