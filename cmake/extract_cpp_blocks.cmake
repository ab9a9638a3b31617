# Writes the ```cpp blocks of a Markdown file, in order, into one C++ source, each preceded by
# a #line directive naming its place in the document (so a compile error points at the doc).
#
#   cmake -DDOC=docs/integration.md -DOUT=build/integration_doc_blocks.inc \
#         -P cmake/extract_cpp_blocks.cmake
#
# Fails when the document has no such block or one is left open.
cmake_minimum_required(VERSION 3.25)
if(NOT DOC OR NOT OUT)
  message(FATAL_ERROR "extract_cpp_blocks: set -DDOC=<markdown file> and -DOUT=<output file>")
endif()
file(READ "${DOC}" text)
set(open_marker "```cpp\n")
set(close_marker "\n```")
set(result "// Generated from ${DOC} by cmake/extract_cpp_blocks.cmake; do not edit.\n")
set(consumed 0)  # characters of the document before `text`
set(count 0)
while(TRUE)
  string(FIND "${text}" "${open_marker}" start)
  if(start EQUAL -1)
    break()
  endif()
  string(LENGTH "${open_marker}" open_len)
  math(EXPR body_start "${start} + ${open_len}")
  string(SUBSTRING "${text}" ${body_start} -1 rest)
  string(FIND "${rest}" "${close_marker}" end)
  if(end EQUAL -1)
    message(FATAL_ERROR "extract_cpp_blocks: ${DOC} has a ```cpp block that is never closed")
  endif()
  # The block's first line number: 1 + the newlines before it (the opening fence's included).
  string(SUBSTRING "${text}" 0 ${body_start} before)
  string(REGEX REPLACE "[^\n]" "" newlines "${before}")
  string(LENGTH "${newlines}" n)
  math(EXPR line "${consumed} + ${n} + 1")
  math(EXPR body_end "${end} + 1")  # keep the block's last newline
  string(SUBSTRING "${rest}" 0 ${body_end} body)
  string(APPEND result "#line ${line} \"${DOC}\"\n${body}")
  string(REGEX REPLACE "[^\n]" "" body_newlines "${body}")
  string(LENGTH "${body_newlines}" bn)
  math(EXPR consumed "${consumed} + ${n} + ${bn}")
  string(LENGTH "${close_marker}" close_len)
  math(EXPR after "${end} + ${close_len}")
  string(SUBSTRING "${rest}" ${after} -1 text)
  math(EXPR count "${count} + 1")
endwhile()
if(count EQUAL 0)
  message(FATAL_ERROR "extract_cpp_blocks: ${DOC} has no ```cpp block")
endif()
file(WRITE "${OUT}.tmp" "${result}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
