// The report: per-class summaries split by class id; the JSON and the table carry the figures.
#include "loadgen/report.h"

#include <gtest/gtest.h>

namespace xds::loadgen {
namespace {

RequestRecord record(int class_id, double send, std::vector<double> events, double end) {
  RequestRecord r;
  r.class_id = class_id;
  r.send_s = send;
  r.event_s = std::move(events);
  r.event_tokens.assign(r.event_s.size(), 1);
  r.completion_tokens = static_cast<int64_t>(r.event_s.size());
  r.prompt_tokens = 8;
  r.end_s = end;
  r.ok = true;
  return r;
}

TEST(Report, ClassesAreSummarizedApart) {
  // Class 0: ITLs of 0.1 s; class 1: one request with ITL 0.5 s.
  const std::vector<RequestRecord> rs = {record(0, 0, {0.2, 0.3, 0.4}, 0.4),
                                         record(1, 0, {1.0, 1.5}, 1.5),
                                         record(0, 1, {1.2, 1.3}, 1.3)};
  const std::vector<RunSummary> per = summarize_classes(rs, 2, 2.0);
  ASSERT_EQ(per.size(), 2u);
  EXPECT_EQ(per[0].completed, 2);
  EXPECT_EQ(per[1].completed, 1);
  EXPECT_NEAR(per[0].itl_ms.p99, 100.0, 1e-9);
  EXPECT_NEAR(per[1].itl_ms.p99, 500.0, 1e-9);
  EXPECT_NEAR(per[1].ttft_ms.p50, 1000.0, 1e-9);
}

TEST(Report, JsonAndTableCarryTheFigures) {
  const std::vector<RequestRecord> rs = {record(0, 0, {0.25, 0.5}, 0.5)};
  const RunSummary s = summarize_run(rs, 0.5);
  const nlohmann::json j = summary_json(s);
  EXPECT_EQ(j["completed"], 1);
  EXPECT_NEAR(j["ttft_ms"]["p50"].get<double>(), 250.0, 1e-9);
  EXPECT_NEAR(j["output_token_throughput"].get<double>(), 4.0, 1e-9);  // 2 tokens / 0.5 s
  const std::string t = summary_table(s, "title");
  EXPECT_NE(t.find("== title =="), std::string::npos);
  EXPECT_NE(t.find("TTFT"), std::string::npos);
  EXPECT_NE(t.find("250.00"), std::string::npos);
}

}  // namespace
}  // namespace xds::loadgen
