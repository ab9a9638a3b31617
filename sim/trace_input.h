// The bytes of a trace, read once in order: the trace readers (trace.h) hold one chunk of the
// file and the row they are parsing, never the file. A 1 GiB line of hash ids is read in
// 1 MiB pieces.
//
// Lines are numbered from 1. A line's leading and trailing ASCII whitespace is not part of it
// (its columns count from its first other byte), and lines holding nothing else are skipped,
// as the readers have always done. Thread-compatible.
#ifndef KVPAGE_SIM_TRACE_INPUT_H_
#define KVPAGE_SIM_TRACE_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvpage::sim {

class TraceInput {
 public:
  // Reads `text`, which must outlive the input.
  explicit TraceInput(absl::string_view text);
  // Reads the regular file at `path` in chunks. NotFound when it cannot be opened.
  static absl::StatusOr<std::unique_ptr<TraceInput>> Open(const std::string& path);
  TraceInput(const TraceInput&) = delete;
  TraceInput& operator=(const TraceInput&) = delete;

  // Moves to the first byte of the next line that holds more than whitespace. False at the
  // end of the input.
  bool NextLine();
  // The current line's number.
  int64_t line() const { return line_; }

  // The rest of the current line, trailing whitespace removed; valid until the next call.
  // InvalidArgument naming `source` and the line when it is longer than `max_bytes` or holds a
  // NUL byte (which a parser would take for the end of the row).
  absl::StatusOr<absl::string_view> TakeLine(absl::string_view source, size_t max_bytes);

  // Byte by byte, for a streaming parser: the next byte of the current line (0..255), or -1
  // at its end (the newline is consumed, not returned).
  int NextInLine() {
    if (line_ended_) return -1;
    if (pos_ == end_ && !Refill()) return EndLine();
    const unsigned char c = static_cast<unsigned char>(*pos_++);
    if (c == '\n') return EndLine();
    ++column_;
    return c;
  }
  // The 1-based column of the byte NextInLine returned last (0 before the first).
  int64_t column() const { return column_; }

  // True when reading the file failed midway (an I/O error, not its end).
  bool failed() const { return failed_; }

 private:
  TraceInput() = default;
  bool Refill();
  int EndLine() {
    line_ended_ = true;
    return -1;
  }

  std::unique_ptr<std::ifstream> file_;  // null when reading a string
  std::string chunk_;                    // the file's current piece
  const char* pos_ = nullptr;
  const char* end_ = nullptr;
  int64_t line_ = 0;
  int64_t column_ = 0;
  bool line_ended_ = true;   // the current line's newline (or the input's end) is consumed
  bool at_line_start_ = true;
  bool failed_ = false;
  std::string line_text_;  // TakeLine's result
};

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_TRACE_INPUT_H_
