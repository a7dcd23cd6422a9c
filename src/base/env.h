// The environment settings xDeepServe reads, declared in one place: the table below (name,
// default, meaning) and one accessor per variable. Code reads a variable only through its
// accessor; nothing else in src/, bench/ or tools/ calls getenv.
//
// Thread safety: each accessor reads the environment when called (getenv), so a test or a
// process may change a setting between calls. Reads from several threads are safe while no
// thread sets variables; set_openblas_coretype / unset_openblas_coretype are for the
// single-threaded start of a process (select_blas_core, before it re-executes itself).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace xds::env {

struct Variable {
  std::string_view name;
  std::string_view default_value;  // what an unset variable means
  std::string_view meaning;
};

// Every variable read, in the order of the accessors below.
std::span<const Variable> variables();

// XDS_LOG_LEVEL: debug | info | warn | error; unset: "info". (log_level() in base/log.h
// reads it once per process.)
std::string log_level();

// XDS_WEIGHT_LAYOUT: "rows" keeps weight matrices in their checkpoint row layout; anything
// else, or unset ("panels"), repacks them into panels.
std::string weight_layout();

// XDS_CACHE_DIR: the folder of repacked weight files, where set and not empty.
std::optional<std::string> cache_dir();

// XDS_CACHE_MAX_GB: the repack folder's size limit in GB (least recently used files are
// removed to stay under it), where set and not empty; the text as set (the cache parses it).
std::optional<std::string> cache_max_gb();
// HOME: the user's home folder, where set and not empty (the repack cache's default parent).
std::optional<std::string> home();

// OPENBLAS_CORETYPE: the OpenBLAS kernel family, where set (even empty): the user's choice,
// which select_blas_core leaves alone.
std::optional<std::string> openblas_coretype();
// Sets / removes OPENBLAS_CORETYPE for a re-executed process; false where setenv failed.
bool set_openblas_coretype(const std::string& core);
void unset_openblas_coretype();

// XDS_EPLB_FAIL_LOAD: test only. The device of this rank fails loading its first new replica's
// weights in every EPLB reconfiguration (a fault-injecting ReplicaLoader), which must abort
// the reconfiguration on every device. Unset or not a number: no failure.
std::optional<int> eplb_fail_load_rank();

}  // namespace xds::env
