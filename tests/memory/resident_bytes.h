// Resident bytes of a range of this process's memory, from /proc/self/smaps (tests only).
#ifndef KVPAGE_TESTS_MEMORY_RESIDENT_BYTES_H_
#define KVPAGE_TESTS_MEMORY_RESIDENT_BYTES_H_

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace kvpage {

// Resident bytes of the mappings inside [base, base + size), from /proc/self/smaps.
inline int64_t ResidentBytes(const void* base, int64_t size) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(base), hi = lo + static_cast<uintptr_t>(size);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  int64_t rss = 0;
  while (std::getline(smaps, line)) {
    uintptr_t start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &start, &end) == 2 && line.find(' ') != std::string::npos &&
        line.find(':') > line.find(' ')) {
      inside = start >= lo && end <= hi;
      continue;
    }
    long kb = 0;
    if (inside && std::sscanf(line.c_str(), "Rss: %ld kB", &kb) == 1) rss += kb * 1024;
  }
  return rss;
}

}  // namespace kvpage

#endif  // KVPAGE_TESTS_MEMORY_RESIDENT_BYTES_H_
