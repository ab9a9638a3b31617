// KVPAGE_UNDER_SANITIZER: 1 in AddressSanitizer builds (make test-sanitize), else 0. Tests
// that replay whole traces, or check invariants after every step, run ~50x slower there and
// use it to do less.
#ifndef KVPAGE_TESTS_TESTING_SANITIZER_H_
#define KVPAGE_TESTS_TESTING_SANITIZER_H_

#if defined(__SANITIZE_ADDRESS__)
#define KVPAGE_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVPAGE_UNDER_SANITIZER 1
#endif
#endif
#ifndef KVPAGE_UNDER_SANITIZER
#define KVPAGE_UNDER_SANITIZER 0
#endif

#endif  // KVPAGE_TESTS_TESTING_SANITIZER_H_
