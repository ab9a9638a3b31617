#include "cli/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace kvpage::cli {

void FlagSet::String(std::string name, std::string* dst, std::string help) {
  flags_.push_back({std::move(name), Type::kString, dst, std::move(help)});
}
void FlagSet::Int(std::string name, int64_t* dst, std::string help) {
  flags_.push_back({std::move(name), Type::kInt, dst, std::move(help)});
}
void FlagSet::Double(std::string name, double* dst, std::string help) {
  flags_.push_back({std::move(name), Type::kDouble, dst, std::move(help)});
}
void FlagSet::Bool(std::string name, bool* dst, std::string help) {
  flags_.push_back({std::move(name), Type::kBool, dst, std::move(help)});
}

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagSet::WasSet(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.set;
  }
  return false;
}

absl::Status FlagSet::Assign(Flag& flag, const std::string& value) {
  switch (flag.type) {
    case Type::kString:
      *static_cast<std::string*>(flag.dst) = value;
      break;
    case Type::kInt: {
      int64_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag.name, ": expected an integer, got '", value, "'"));
      }
      *static_cast<int64_t*>(flag.dst) = v;
      break;
    }
    case Type::kDouble: {
      double v = 0;
      if (!absl::SimpleAtod(value, &v) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag.name, ": expected a number, got '", value, "'"));
      }
      *static_cast<double*>(flag.dst) = v;
      break;
    }
    case Type::kBool:
      *static_cast<bool*>(flag.dst) = true;
      break;
  }
  flag.set = true;
  return absl::OkStatus();
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args, bool* help_requested) {
  *help_requested = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      *help_requested = true;
      return absl::OkStatus();
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    Flag* flag = Find(name);
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (flag->type == Type::kBool) {
      if (has_value) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
    } else if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    if (absl::Status s = Assign(*flag, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string FlagSet::Help() const {
  std::string out = usage_ + "\n\nFlags:\n";
  for (const Flag& f : flags_) {
    const char* arg = f.type == Type::kBool ? "" : " VALUE";
    absl::StrAppendFormat(&out, "  --%s%s\n", f.name, arg);
    for (absl::string_view line : absl::StrSplit(f.help, '\n')) {
      absl::StrAppend(&out, "      ", line, "\n");
    }
  }
  return out;
}

absl::Status ParseTokenCount(const std::string& flag, const std::string& text, int64_t* out) {
  std::string digits = text;
  int64_t scale = 1;
  if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'K')) {
    scale = 1024;
    digits.pop_back();
  } else if (!digits.empty() && (digits.back() == 'm' || digits.back() == 'M')) {
    scale = 1024 * 1024;
    digits.pop_back();
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(digits, &v) || v <= 0 || v > (int64_t{1} << 40) / scale) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": expected a positive token count such as 32768 or 32K, got '", text, "'"));
  }
  *out = v * scale;
  return absl::OkStatus();
}

absl::Status ParseTokenCountList(const std::string& flag, const std::string& text,
                                 std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (absl::Status s = ParseTokenCount(flag, std::string(part), &v); !s.ok()) return s;
    out->push_back(v);
  }
  return absl::OkStatus();
}

}  // namespace kvpage::cli
