#include "eplb/plan_json.h"

#include <limits>
#include <set>

#include <nlohmann/json.hpp>

namespace xds::eplb {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// A short rendering of a value for an error message.
std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

Result<json> parse_object(std::string_view text, std::string_view source) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    return invalid_argument("{}: invalid JSON: {}", source, e.what());
  }
  if (!doc.is_object()) {
    return invalid_argument("{}: expected a JSON object, got {}", source, shown(doc));
  }
  return doc;
}

// obj[key] as an int in [lo, hi]; `where` names the object ("layers[2]").
Result<int> int_field(const json& obj, const char* key, std::string_view where,
                      std::string_view source, int64_t lo) {
  const std::string field = where.empty() ? key : fmt::format("{}.{}", where, key);
  if (!obj.contains(key)) return invalid_argument("{}: field '{}' is missing", source, field);
  const json& v = obj[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo ||
      v.get<int64_t>() > std::numeric_limits<int>::max() ||
      (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{std::numeric_limits<int>::max()})) {
    return invalid_argument("{}: field '{}' must be an integer >= {}, got {}", source, field, lo,
                            shown(v));
  }
  return static_cast<int>(v.get<int64_t>());
}

Result<const json*> array_field(const json& obj, const char* key, std::string_view where,
                                std::string_view source) {
  const std::string field = where.empty() ? key : fmt::format("{}.{}", where, key);
  if (!obj.contains(key)) return invalid_argument("{}: field '{}' is missing", source, field);
  const json& v = obj[key];
  if (!v.is_array()) {
    return invalid_argument("{}: field '{}' must be an array, got {}", source, field, shown(v));
  }
  return &v;
}

// An array of integers >= 0 (expert ids).
Result<std::vector<int>> id_list(const json& obj, const char* key, std::string_view where,
                                 std::string_view source) {
  XDS_ASSIGN_OR_RETURN(const json* arr, array_field(obj, key, where, source));
  std::vector<int> ids;
  for (size_t i = 0; i < arr->size(); ++i) {
    const json& v = (*arr)[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int>::max()) {
      return invalid_argument("{}: field '{}.{}[{}]' must be an integer >= 0, got {}", source,
                              where, key, i, shown(v));
    }
    ids.push_back(static_cast<int>(v.get<int64_t>()));
  }
  return ids;
}

Result<LayerCounts> parse_layer_counts(const json& item, size_t index, int n_experts,
                                       std::string_view source) {
  const std::string where = fmt::format("layers[{}]", index);
  if (!item.is_object()) {
    return invalid_argument("{}: '{}' must be an object, got {}", source, where, shown(item));
  }
  LayerCounts layer;
  XDS_ASSIGN_OR_RETURN(layer.layer, int_field(item, "layer", where, source, 0));
  XDS_ASSIGN_OR_RETURN(const json* slices, array_field(item, "counts", where, source));
  if (slices->empty()) {
    return invalid_argument("{}: field '{}.counts' has no time slices", source, where);
  }
  layer.n_slices = static_cast<int>(slices->size());
  layer.counts.reserve(slices->size() * static_cast<size_t>(n_experts));
  for (size_t t = 0; t < slices->size(); ++t) {
    const json& row = (*slices)[t];
    if (!row.is_array() || row.size() != static_cast<size_t>(n_experts)) {
      return invalid_argument(
          "{}: field '{}.counts[{}]' must be an array of n_experts = {} numbers, got {}", source,
          where, t, n_experts, row.is_array() ? fmt::format("{} values", row.size()) : shown(row));
    }
    for (size_t e = 0; e < row.size(); ++e) {
      const json& v = row[e];
      if (!v.is_number() || v.get<double>() < 0) {
        return invalid_argument("{}: field '{}.counts[{}][{}]' must be a number >= 0, got {}",
                                source, where, t, e, shown(v));
      }
      layer.counts.push_back(v.get<double>());
    }
  }
  return layer;
}

Result<LayerPlan> parse_layer_plan(const json& item, size_t index, std::string_view source) {
  const std::string where = fmt::format("layers[{}]", index);
  if (!item.is_object()) {
    return invalid_argument("{}: '{}' must be an object, got {}", source, where, shown(item));
  }
  LayerPlan plan;
  XDS_ASSIGN_OR_RETURN(plan.layer, int_field(item, "layer", where, source, 0));
  XDS_ASSIGN_OR_RETURN(plan.replicas, id_list(item, "replicas", where, source));
  XDS_ASSIGN_OR_RETURN(plan.dropped, id_list(item, "dropped", where, source));
  XDS_ASSIGN_OR_RETURN(const json* placement, array_field(item, "placement", where, source));
  for (size_t i = 0; i < placement->size(); ++i) {
    const json& p = (*placement)[i];
    const std::string at = fmt::format("{}.placement[{}]", where, i);
    if (!p.is_object()) {
      return invalid_argument("{}: '{}' must be an object, got {}", source, at, shown(p));
    }
    Placement pl;
    XDS_ASSIGN_OR_RETURN(pl.expert, int_field(p, "expert", at, source, 0));
    XDS_ASSIGN_OR_RETURN(pl.device, int_field(p, "device", at, source, 0));
    plan.placement.push_back(pl);
  }
  for (const char* key : {"tail_before", "tail_after"}) {
    if (!item.contains(key) || !item[key].is_number()) {
      return invalid_argument("{}: field '{}.{}' must be a number, got {}", source, where, key,
                              item.contains(key) ? shown(item[key]) : "nothing");
    }
  }
  plan.tail_before = item["tail_before"].get<double>();
  plan.tail_after = item["tail_after"].get<double>();
  return plan;
}

}  // namespace

Result<CountsFile> parse_counts_json(std::string_view text, std::string_view source) {
  XDS_ASSIGN_OR_RETURN(json doc, parse_object(text, source));
  CountsFile out;
  XDS_ASSIGN_OR_RETURN(out.n_experts, int_field(doc, "n_experts", "", source, 1));
  XDS_ASSIGN_OR_RETURN(const json* layers, array_field(doc, "layers", "", source));
  std::set<int> seen;
  for (size_t i = 0; i < layers->size(); ++i) {
    XDS_ASSIGN_OR_RETURN(LayerCounts layer,
                         parse_layer_counts((*layers)[i], i, out.n_experts, source));
    if (!seen.insert(layer.layer).second) {
      return invalid_argument("{}: field 'layers[{}].layer': layer {} appears more than once",
                              source, i, layer.layer);
    }
    out.layers.push_back(std::move(layer));
  }
  return out;
}

std::string plan_to_json(const Plan& plan) {
  std::string out = "{\"layers\": [";
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    const LayerPlan& l = plan.layers[i];
    ojson j;
    j["layer"] = l.layer;
    j["replicas"] = l.replicas;
    ojson placement = ojson::array();
    for (const Placement& p : l.placement) {
      placement.push_back({{"expert", p.expert}, {"device", p.device}});
    }
    j["placement"] = std::move(placement);
    j["dropped"] = l.dropped;
    j["tail_before"] = l.tail_before;
    j["tail_after"] = l.tail_after;
    out += i == 0 ? "\n  " : ",\n  ";
    out += j.dump();
  }
  out += plan.layers.empty() ? "]}\n" : "\n]}\n";
  return out;
}

Result<Plan> parse_plan_json(std::string_view text, std::string_view source) {
  XDS_ASSIGN_OR_RETURN(json doc, parse_object(text, source));
  XDS_ASSIGN_OR_RETURN(const json* layers, array_field(doc, "layers", "", source));
  Plan plan;
  for (size_t i = 0; i < layers->size(); ++i) {
    XDS_ASSIGN_OR_RETURN(LayerPlan layer, parse_layer_plan((*layers)[i], i, source));
    plan.layers.push_back(std::move(layer));
  }
  return plan;
}

}  // namespace xds::eplb
