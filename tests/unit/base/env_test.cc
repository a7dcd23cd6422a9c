// The environment table and its accessors: each variable set, unset and (where the accessor
// treats it so) empty, against the values the table documents.
#include "base/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <set>
#include <string>

namespace xds::env {
namespace {

// Sets (or, with nullopt, removes) one variable for a test and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    if (value.has_value()) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (saved_.has_value()) {
      ::setenv(name_, saved_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

TEST(Env, TableNamesEachVariableOnceWithDefaultAndMeaning) {
  std::set<std::string> names;
  for (const Variable& v : variables()) {
    EXPECT_TRUE(names.insert(std::string(v.name)).second) << v.name;
    EXPECT_FALSE(v.default_value.empty()) << v.name;
    EXPECT_FALSE(v.meaning.empty()) << v.name;
  }
  const std::set<std::string> expected = {"XDS_LOG_LEVEL",     "XDS_WEIGHT_LAYOUT",
                                          "XDS_CACHE_DIR",     "XDS_CACHE_MAX_GB",
                                          "HOME",              "OPENBLAS_CORETYPE",
                                          "XDS_EPLB_FAIL_LOAD"};
  EXPECT_EQ(names, expected);
}

TEST(Env, LogLevelAndWeightLayoutFallBackToTheirDefaults) {
  {
    const ScopedEnv a("XDS_LOG_LEVEL", std::nullopt), b("XDS_WEIGHT_LAYOUT", std::nullopt);
    EXPECT_EQ(log_level(), "info");
    EXPECT_EQ(weight_layout(), "panels");
  }
  const ScopedEnv a("XDS_LOG_LEVEL", "warn"), b("XDS_WEIGHT_LAYOUT", "rows");
  EXPECT_EQ(log_level(), "warn");
  EXPECT_EQ(weight_layout(), "rows");
}

TEST(Env, CacheDirAndHomeTreatEmptyAsUnset) {
  for (const char* name : {"XDS_CACHE_DIR", "HOME"}) {
    auto get = [&] { return std::string(name) == "HOME" ? home() : cache_dir(); };
    {
      const ScopedEnv e(name, std::nullopt);
      EXPECT_EQ(get(), std::nullopt) << name;
    }
    {
      const ScopedEnv e(name, "");
      EXPECT_EQ(get(), std::nullopt) << name;
    }
    const ScopedEnv e(name, "/some/dir");
    EXPECT_EQ(get(), "/some/dir") << name;
  }
}

TEST(Env, OpenblasCoretypeIsSetEvenWhenEmptyAndCanBeSetAndRemoved) {
  const ScopedEnv e("OPENBLAS_CORETYPE", std::nullopt);
  EXPECT_EQ(openblas_coretype(), std::nullopt);
  ASSERT_TRUE(set_openblas_coretype("Haswell"));
  EXPECT_EQ(openblas_coretype(), "Haswell");
  EXPECT_STREQ(std::getenv("OPENBLAS_CORETYPE"), "Haswell");
  ASSERT_TRUE(set_openblas_coretype(""));
  EXPECT_EQ(openblas_coretype(), "");
  unset_openblas_coretype();
  EXPECT_EQ(openblas_coretype(), std::nullopt);
}

}  // namespace
}  // namespace xds::env
