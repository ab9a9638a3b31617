// ParseSlo: accepted terms with their limits, every malformed form rejected naming the term;
// MeetsSlo and WorstSloRatio on a summary.
#include "sim/slo.h"

#include <gtest/gtest.h>

#include <string>

namespace kvpage::sim {
namespace {

TEST(SloTest, ParsesTermsUnitsAndStatistics) {
  auto slo = ParseSlo("ttft-p99=2s,tpot-p99=100ms, itl-p99 = 0.5s,e2e-p50=30s,ttft-p90=250ms");
  ASSERT_TRUE(slo.ok()) << slo.status();
  ASSERT_EQ(slo->size(), 5u);
  EXPECT_EQ((*slo)[0].name, "ttft-p99");
  EXPECT_DOUBLE_EQ((*slo)[0].limit_ms, 2000);
  EXPECT_EQ((*slo)[1].name, "tpot-p99");
  EXPECT_DOUBLE_EQ((*slo)[1].limit_ms, 100);
  EXPECT_EQ((*slo)[2].name, "itl-p99");
  EXPECT_DOUBLE_EQ((*slo)[2].limit_ms, 500);
  EXPECT_DOUBLE_EQ((*slo)[3].limit_ms, 30000);

  MetricsSummary s;
  s.completed = 10;
  s.ttft_ms.p99 = 1999;
  s.ttft_ms.p90 = 250;
  s.tpot_ms.p99 = 100;
  s.itl_ms.p99 = 120;
  s.e2el_ms.median = 29000;
  EXPECT_DOUBLE_EQ((*slo)[0].ValueMs(s), 1999);
  EXPECT_DOUBLE_EQ((*slo)[3].ValueMs(s), 29000);
  EXPECT_TRUE(MeetsSlo(s, *slo));  // limits are inclusive
  s.ttft_ms.p90 = 250.5;
  EXPECT_FALSE(MeetsSlo(s, *slo));
  EXPECT_DOUBLE_EQ(WorstSloRatio({1999, 100, 120, 29000, 250.5}, *slo), 250.5 / 250);
  EXPECT_EQ(SloToString(*slo),
            "ttft-p99 <= 2 s, tpot-p99 <= 100 ms, itl-p99 <= 500 ms, e2e-p50 <= 30 s, "
            "ttft-p90 <= 250 ms");
}

TEST(SloTest, EmptyRunMeetsNothing) {
  auto slo = ParseSlo("ttft-p99=2s");
  ASSERT_TRUE(slo.ok());
  EXPECT_FALSE(MeetsSlo(MetricsSummary{}, *slo));
}

TEST(SloTest, RejectsMalformedTermsNamingThem) {
  const struct {
    const char* text;
    const char* message;
  } cases[] = {
      {"", "--slo is empty"},
      {"ttft-p99=", "--slo term 'ttft-p99=': has no value"},
      {"ttft=2s", "--slo term 'ttft=2s': unknown metric 'ttft'"},
      {"ttft-p99=-1s", "--slo term 'ttft-p99=-1s': limit must be positive, got '-1s'"},
      {"ttft-p99=0ms", "limit must be positive, got '0ms'"},
      {"ttft-p99=2", "--slo term 'ttft-p99=2': value '2' needs a unit, s or ms"},
      {"ttft-p99=2min", "value '2min' needs a unit"},
      {"ttft-p99=fast s", "'fast s' is not a number"},
      {"ttft-p99=nans", "'nans' is not a number"},
      {"latency-p99=2s", "unknown metric 'latency-p99'"},
      {"ttft-p95=2s", "unknown metric 'ttft-p95'"},
      {"ttft-p99", "--slo term 'ttft-p99': expected METRIC-STAT=LIMIT"},
      {"ttft-p99=2s,,tpot-p99=1s", "has an empty term"},
      {"ttft-p99=2s,ttft-p99=3s", "--slo term 'ttft-p99=3s': repeats an earlier term"},
  };
  for (const auto& c : cases) {
    auto slo = ParseSlo(c.text);
    EXPECT_TRUE(absl::IsInvalidArgument(slo.status())) << c.text;
    EXPECT_NE(slo.status().message().find(c.message), std::string::npos)
        << c.text << " -> " << slo.status().message();
  }
}

}  // namespace
}  // namespace kvpage::sim
