// etcd's JSON gateway encoding against hand-written answers in the form etcd 3.4's gateway
// sends (int64 as strings, base64 keys and values, defaults left out, streamed lines wrapped in
// "result"), and base64 against RFC 4648's test vectors.
#include "serve/etcd_json.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace xds::serve::etcd {
namespace {

using nlohmann::json;

TEST(EtcdJson, Base64MatchesRfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(plain), encoded);
    auto back = base64_decode(encoded, "test");
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back, plain);
  }
  // Every byte value survives (0x00..0xff, hand-checked first group: 00 01 02 -> AAEC).
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(base64_encode(all).substr(0, 4), "AAEC");
  EXPECT_EQ(*base64_decode(base64_encode(all), "test"), all);
}

TEST(EtcdJson, Base64RejectsBadInputNamingIt) {
  auto bad_length = base64_decode("Zm9", "etcd range field 'key'");
  ASSERT_FALSE(bad_length.ok());
  EXPECT_NE(bad_length.status().message().find("etcd range field 'key'"), std::string::npos);
  EXPECT_FALSE(base64_decode("Zm9*", "x").ok());
  EXPECT_FALSE(base64_decode("Z===", "x").ok());      // one data character cannot make a byte
  EXPECT_FALSE(base64_decode("Zg=a", "x").ok());      // data after padding
  EXPECT_FALSE(base64_decode("Zg==Zg==", "x").ok());  // padding before the end
}

TEST(EtcdJson, PrefixRangeEndIncrementsTheLastByte) {
  EXPECT_EQ(prefix_range_end("/x/"), "/x0");  // '/' + 1 = '0'
  EXPECT_EQ(prefix_range_end("a"), "b");
  EXPECT_EQ(prefix_range_end(std::string("a\xff", 2)), "b");
  EXPECT_EQ(prefix_range_end(""), std::string(1, '\0'));
}

TEST(EtcdJson, RequestBodies) {
  // "/xdeepserve/instances/" and its range end ".../instances0", base64 by hand:
  const json range = json::parse(range_prefix_request("/x/"));
  EXPECT_EQ(range["key"], "L3gv");
  EXPECT_EQ(range["range_end"], "L3gw");
  const json put = json::parse(put_request("/x/a", "{}", 7587899417140579077));
  EXPECT_EQ(put["key"], "L3gvYQ==");
  EXPECT_EQ(put["value"], "e30=");
  EXPECT_EQ(put["lease"], "7587899417140579077");
  EXPECT_FALSE(json::parse(put_request("/x/a", "{}", 0)).contains("lease"));
  EXPECT_EQ(json::parse(lease_grant_request(5))["TTL"], "5");
  EXPECT_EQ(json::parse(lease_id_request(12))["ID"], "12");
  const json watch = json::parse(watch_create_request("/x/", 42));
  EXPECT_EQ(watch["create_request"]["key"], "L3gv");
  EXPECT_EQ(watch["create_request"]["range_end"], "L3gw");
  EXPECT_EQ(watch["create_request"]["start_revision"], "42");
}

TEST(EtcdJson, ParsesARangeAnswer) {
  const char* body =
      R"({"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437",)"
      R"("revision":"9","raft_term":"2"},"kvs":[{"key":"L3gvYQ==","create_revision":"2",)"
      R"("mod_revision":"8","version":"3","value":"eyJhIjoxfQ==","lease":"7587899417140579079"},)"
      R"({"key":"L3gvYg==","create_revision":"4","mod_revision":"4","version":"1"}],"count":"2"})";
  auto r = parse_range_answer(body);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->revision, 9);
  ASSERT_EQ(r->kvs.size(), 2u);
  EXPECT_EQ(r->kvs[0].key, "/x/a");
  EXPECT_EQ(r->kvs[0].value, "{\"a\":1}");
  EXPECT_EQ(r->kvs[0].mod_revision, 8);
  EXPECT_EQ(r->kvs[0].lease, 7587899417140579079);
  EXPECT_EQ(r->kvs[1].key, "/x/b");
  EXPECT_EQ(r->kvs[1].value, "");  // an empty value is left out
  EXPECT_EQ(r->kvs[1].lease, 0);
  // No kvs at all (an empty prefix).
  auto empty = parse_range_answer(R"({"header":{"revision":"1"}})");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->kvs.empty());
}

TEST(EtcdJson, ErrorsCarryEtcdsMessageAndBadAnswersNameTheField) {
  auto err = parse_range_answer(
      R"({"error":"etcdserver: mvcc: required revision has been compacted","code":11})");
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(err.status().message().find("compacted"), std::string::npos);
  auto bad_rev = parse_range_answer(R"({"header":{"revision":"x9"}})");
  ASSERT_FALSE(bad_rev.ok());
  EXPECT_NE(bad_rev.status().message().find("'revision'"), std::string::npos);
  EXPECT_FALSE(parse_range_answer("404 page not found").ok());
  EXPECT_FALSE(parse_range_answer(R"({"header":{"revision":"3"},"kvs":[{"key":"!!"}]})").ok());
  Status revoke = parse_unary_answer(
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5})",
      "lease revoke");
  EXPECT_EQ(revoke.code(), StatusCode::kUnavailable);
  EXPECT_NE(revoke.message().find("lease not found"), std::string::npos);
  EXPECT_TRUE(parse_unary_answer(R"({"header":{"revision":"3"}})", "put").ok());
}

TEST(EtcdJson, LeaseAnswers) {
  auto g = parse_lease_grant_answer(
      R"({"header":{"revision":"1"},"ID":"7587899417140579077","TTL":"5"})");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->id, 7587899417140579077);
  EXPECT_EQ(g->ttl_s, 5);
  EXPECT_FALSE(parse_lease_grant_answer(R"({"header":{"revision":"1"}})").ok());
  auto alive = parse_keepalive_answer(
      "{\"result\":{\"header\":{\"revision\":\"2\"},\"ID\":\"7587899417140579079\",\"TTL\":\"5\"}}"
      "\n");
  ASSERT_TRUE(alive.ok()) << alive.status().to_string();
  EXPECT_EQ(*alive, 5);
  // A lease etcd no longer knows: the answer leaves TTL (0) out.
  auto gone = parse_keepalive_answer(R"({"result":{"header":{"revision":"2"},"ID":"123"}})");
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(*gone, 0);
}

TEST(EtcdJson, WatchMessages) {
  auto created = parse_watch_message(
      R"({"result":{"header":{"revision":"3","raft_term":"2"},"created":true}})");
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  EXPECT_TRUE(created->created);
  EXPECT_TRUE(created->events.empty());
  auto events = parse_watch_message(
      R"({"result":{"header":{"revision":"5"},"events":[)"
      R"({"type":"DELETE","kv":{"key":"L3gvYQ==","mod_revision":"4"}},)"
      R"({"kv":{"key":"L3gvYQ==","create_revision":"5","mod_revision":"5","version":"1","value":"e30="}}]}})");
  ASSERT_TRUE(events.ok()) << events.status().to_string();
  ASSERT_EQ(events->events.size(), 2u);
  EXPECT_EQ(events->events[0].type, WatchEventType::kDelete);
  EXPECT_EQ(events->events[0].kv.mod_revision, 4);
  EXPECT_EQ(events->events[1].type, WatchEventType::kPut);  // no "type": a PUT
  EXPECT_EQ(events->events[1].kv.value, "{}");
  auto compacted = parse_watch_message(
      R"({"result":{"header":{"raft_term":"2"},"canceled":true,"compact_revision":"2"}})");
  ASSERT_TRUE(compacted.ok());
  EXPECT_TRUE(compacted->canceled);
  EXPECT_EQ(compacted->compact_revision, 2);
  auto error =
      parse_watch_message(R"({"error":{"grpc_code":14,"message":"etcdserver: no leader"}})");
  ASSERT_FALSE(error.ok());
  EXPECT_NE(error.status().message().find("no leader"), std::string::npos);
  EXPECT_FALSE(
      parse_watch_message(R"({"result":{"events":[{"type":"MOVE","kv":{"key":"YQ=="}}]}})").ok());
}

TEST(EtcdJson, InstanceRecordRoundTripsAndNamesBadFields) {
  InstanceRecord r;
  r.address = "tcp://10.0.0.5:8100";
  r.role = "decode";
  r.model = "kjv-moe-tiny";
  r.groups = {0, 1};
  r.running = 3;
  r.kv_usage = 0.25;
  const json j = json::parse(instance_record_json(r));
  EXPECT_EQ(j["address"], "tcp://10.0.0.5:8100");
  EXPECT_EQ(j["groups"], json::array({0, 1}));
  EXPECT_EQ(j["load"]["running"], 3);
  auto back = parse_instance_record(instance_record_json(r), "/k");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, r);

  auto no_role = parse_instance_record(R"({"address":"tcp://h:1","groups":[0]})", "/p/h:1");
  ASSERT_FALSE(no_role.ok());
  EXPECT_NE(no_role.status().message().find("/p/h:1"), std::string::npos);
  EXPECT_NE(no_role.status().message().find("'role'"), std::string::npos);
  EXPECT_FALSE(
      parse_instance_record(R"({"address":"http://h:1","role":"decode","groups":[0]})", "k").ok());
  EXPECT_FALSE(
      parse_instance_record(R"({"address":"tcp://h:1","role":"boss","groups":[0]})", "k").ok());
  EXPECT_FALSE(
      parse_instance_record(R"({"address":"tcp://h:1","role":"decode","groups":[-1]})", "k").ok());
  EXPECT_FALSE(parse_instance_record("not json", "k").ok());
  // A load of the wrong type is ignored (left at 0), not a crash; a count must be an integer.
  auto odd = parse_instance_record(R"({"address":"tcp://h:1","role":"decode","groups":[0],)"
                                   R"("load":{"running":"x","waiting":1e30,"kv_usage":1}})",
                                   "k");
  ASSERT_TRUE(odd.ok()) << odd.status().to_string();
  EXPECT_EQ(odd->running, 0);
  EXPECT_EQ(odd->waiting, 0);
  EXPECT_EQ(odd->kv_usage, 1.0);
  EXPECT_EQ(instance_key("/xdeepserve/instances/", "tcp://10.0.0.5:8100"),
            "/xdeepserve/instances/10.0.0.5:8100");
}

}  // namespace
}  // namespace xds::serve::etcd
