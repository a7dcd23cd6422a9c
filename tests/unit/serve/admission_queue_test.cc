// The gateway's admission queue (serve/admission_queue.h): each sequence of events is walked
// by hand through the rules at the top of the header, and the expected queue written out.
#include "serve/admission_queue.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace xds::serve {
namespace {

auto alive_all = [](const std::string&) { return true; };

TEST(AdmissionQueue, AcceptsUntilMaxWaitingAndAlwaysWhenEmpty) {
  AdmissionQueue q(2);
  EXPECT_TRUE(q.accepts_new());
  EXPECT_EQ(q.defer("a"), AdmissionQueue::Deferral::kQueued);
  EXPECT_TRUE(q.accepts_new());  // 1 < 2
  EXPECT_EQ(q.defer("b"), AdmissionQueue::Deferral::kQueued);
  EXPECT_FALSE(q.accepts_new());  // 2 wait
  EXPECT_EQ(q.defer("c"), AdmissionQueue::Deferral::kFull);
  EXPECT_EQ(q.size(), 2u);
  EXPECT_FALSE(q.contains("c"));

  AdmissionQueue none(0);
  EXPECT_TRUE(none.accepts_new());  // nothing waits
  EXPECT_EQ(none.defer("a"), AdmissionQueue::Deferral::kFull);
  EXPECT_TRUE(none.hold("a"));  // backpressure ignores the limit
  EXPECT_FALSE(none.accepts_new());
}

TEST(AdmissionQueue, OffersTheHeadOnceUntilItIsAnswered) {
  AdmissionQueue q(8);
  EXPECT_EQ(q.offer(alive_all), std::nullopt);  // empty
  ASSERT_EQ(q.defer("a"), AdmissionQueue::Deferral::kQueued);
  ASSERT_EQ(q.defer("b"), AdmissionQueue::Deferral::kQueued);
  EXPECT_EQ(q.offer(alive_all), "a");
  EXPECT_TRUE(q.offer_in_flight());
  EXPECT_EQ(q.offer(alive_all), std::nullopt);  // a's offer is not answered yet
  // The instance still has no room for a: it keeps its place and may be offered again.
  EXPECT_EQ(q.defer("a"), AdmissionQueue::Deferral::kWaiting);
  EXPECT_FALSE(q.offer_in_flight());
  EXPECT_EQ(q.size(), 2u);
  EXPECT_EQ(q.offer(alive_all), "a");
  // This time a is placed: its first output leaves the queue, b is next.
  q.placed("a");
  EXPECT_FALSE(q.contains("a"));
  EXPECT_FALSE(q.offer_in_flight());
  EXPECT_EQ(q.offer(alive_all), "b");
}

TEST(AdmissionQueue, ARefusalOfAWaitingRequestLaterInTheQueueDoesNotEndTheHeadsOffer) {
  AdmissionQueue q(8);
  ASSERT_EQ(q.defer("a"), AdmissionQueue::Deferral::kQueued);
  ASSERT_EQ(q.defer("b"), AdmissionQueue::Deferral::kQueued);
  EXPECT_EQ(q.offer(alive_all), "a");
  EXPECT_EQ(q.defer("b"), AdmissionQueue::Deferral::kWaiting);
  EXPECT_TRUE(q.offer_in_flight());
  // A request that never fits: as the head it leaves and ends the offer ...
  q.refuse("a");
  EXPECT_EQ(q.size(), 1u);
  EXPECT_FALSE(q.offer_in_flight());
  // ... further back it stays counted until it reaches the head, where the gateway finds it
  // gone and drops it.
  ASSERT_EQ(q.defer("c"), AdmissionQueue::Deferral::kQueued);  // b, c
  q.refuse("c");
  EXPECT_EQ(q.size(), 2u);
  std::set<std::string> alive = {"b"};
  auto is_alive = [&](const std::string& id) { return alive.count(id) > 0; };
  EXPECT_EQ(q.offer(is_alive), "b");
  q.placed("b");
  EXPECT_EQ(q.offer(is_alive), std::nullopt);  // c is dropped, nothing offered this time
  EXPECT_TRUE(q.empty());
}

TEST(AdmissionQueue, ADeadHeadIsDroppedOnePerOffer) {
  AdmissionQueue q(8);
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(q.hold(id));
  EXPECT_FALSE(q.hold("b"));  // waits already
  std::set<std::string> alive = {"c"};
  auto is_alive = [&](const std::string& id) { return alive.count(id) > 0; };
  EXPECT_EQ(q.offer(is_alive), std::nullopt);  // a dropped
  EXPECT_EQ(q.offer(is_alive), std::nullopt);  // b dropped
  EXPECT_EQ(q.offer(is_alive), "c");
  EXPECT_EQ(q.size(), 1u);
}

TEST(AdmissionQueue, CancelAndPlacedRemoveAnyWaitingRequest) {
  AdmissionQueue q(8);
  for (const char* id : {"a", "b", "c"}) ASSERT_EQ(q.defer(id), AdmissionQueue::Deferral::kQueued);
  q.cancel("b");
  EXPECT_FALSE(q.contains("b"));
  EXPECT_EQ(q.size(), 2u);
  q.cancel("zzz");  // not waiting: nothing happens
  EXPECT_EQ(q.size(), 2u);
  q.placed("c");  // a request further back placed after all
  EXPECT_EQ(q.size(), 1u);
  q.placed("c");  // not waiting any more: nothing happens
  EXPECT_EQ(q.offer(alive_all), "a");
  q.clear();
  EXPECT_TRUE(q.empty());
  EXPECT_FALSE(q.offer_in_flight());
  EXPECT_TRUE(q.accepts_new());
}

TEST(AdmissionQueue, ACancelledOfferedHeadLetsTheNextBeOffered) {
  AdmissionQueue q(8);
  ASSERT_EQ(q.defer("a"), AdmissionQueue::Deferral::kQueued);
  ASSERT_EQ(q.defer("b"), AdmissionQueue::Deferral::kQueued);
  EXPECT_EQ(q.offer(alive_all), "a");
  // a's client goes away while its offer is in flight: the instance's answer about a finds
  // nothing in the gateway, so the offer ends here and b is offered on the next load report.
  q.cancel("a");
  EXPECT_FALSE(q.offer_in_flight());
  EXPECT_EQ(q.offer(alive_all), "b");
  // Cancelling a request behind the offered head leaves the offer in flight.
  ASSERT_EQ(q.defer("c"), AdmissionQueue::Deferral::kQueued);
  q.cancel("c");
  EXPECT_TRUE(q.offer_in_flight());
}

TEST(AdmissionQueue, AnOfferLostWithItsInstanceIsMadeAgainWithTheHeadInPlace) {
  AdmissionQueue q(8);
  ASSERT_EQ(q.defer("a"), AdmissionQueue::Deferral::kQueued);
  ASSERT_EQ(q.defer("b"), AdmissionQueue::Deferral::kQueued);
  ASSERT_NE(q.head(), nullptr);
  EXPECT_EQ(*q.head(), "a");
  EXPECT_EQ(q.offer(alive_all), "a");
  EXPECT_EQ(q.offer(alive_all), std::nullopt);  // in flight: the queue would wait forever
  q.offer_lost();                               // ... had its instance not been reported failed
  EXPECT_FALSE(q.offer_in_flight());
  EXPECT_EQ(q.size(), 2u);
  EXPECT_EQ(*q.head(), "a");
  EXPECT_EQ(q.offer(alive_all), "a");  // sent again (to a surviving instance)
  q.placed("a");
  EXPECT_EQ(q.offer(alive_all), "b");
  q.placed("b");
  EXPECT_EQ(q.head(), nullptr);
}

}  // namespace
}  // namespace xds::serve
