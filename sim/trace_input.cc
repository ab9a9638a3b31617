// The trace readers' input (see trace_input.h).
#include "sim/trace_input.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kvpage::sim {
namespace {

// The file is read in pieces of this size.
constexpr size_t kChunkBytes = size_t{1} << 20;

}  // namespace

TraceInput::TraceInput(absl::string_view text)
    : pos_(text.data()), end_(text.data() + text.size()) {}

absl::StatusOr<std::unique_ptr<TraceInput>> TraceInput::Open(const std::string& path) {
  std::error_code ec;
  auto file = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!std::filesystem::is_regular_file(path, ec) || !*file) {
    return absl::NotFoundError(absl::StrCat("cannot read trace file '", path, "'"));
  }
  std::unique_ptr<TraceInput> input(new TraceInput());
  input->file_ = std::move(file);
  input->chunk_.resize(kChunkBytes);
  return input;
}

bool TraceInput::Refill() {
  if (file_ == nullptr || failed_) return false;
  file_->read(chunk_.data(), static_cast<std::streamsize>(chunk_.size()));
  const auto got = static_cast<size_t>(file_->gcount());
  if (got == 0) {
    failed_ = file_->bad();
    return false;
  }
  pos_ = chunk_.data();
  end_ = pos_ + got;
  return true;
}

bool TraceInput::NextLine() {
  while (!line_ended_) NextInLine();  // the rest of the current line
  while (true) {
    ++line_;
    column_ = 0;
    while (true) {
      if (pos_ == end_ && !Refill()) return false;
      const char c = *pos_;
      if (c == '\n') {  // a blank line
        ++pos_;
        break;
      }
      if (!absl::ascii_isspace(static_cast<unsigned char>(c))) {
        line_ended_ = false;
        return true;
      }
      ++pos_;
    }
  }
}

absl::StatusOr<absl::string_view> TraceInput::TakeLine(absl::string_view source,
                                                       size_t max_bytes) {
  line_text_.clear();
  for (int c = NextInLine(); c >= 0; c = NextInLine()) {
    if (c == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_, ": NUL byte at column ", column_));
    }
    if (line_text_.size() == max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", line_, ": line longer than ", max_bytes, " bytes"));
    }
    line_text_.push_back(static_cast<char>(c));
  }
  return absl::StripTrailingAsciiWhitespace(line_text_);
}

}  // namespace kvpage::sim
