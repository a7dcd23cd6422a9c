#include "engine/speculative.h"

namespace xds::engine {

Status speculative_accept(Sampler& sampler, const SpecVerifyInput& in, SpecVerifyResult& out) {
  out.accepted = 0;
  out.tokens.clear();
  if (in.options == nullptr) return invalid_argument("speculative accept: options are null");
  if (in.logits == nullptr) return invalid_argument("speculative accept: logits are null");
  if (in.row_stride < in.valid_vocab) {
    return invalid_argument("speculative accept: row stride {} below the valid vocabulary {}",
                            in.row_stride, in.valid_vocab);
  }
  for (size_t i = 0; i < in.drafts.size(); ++i) {
    if (in.drafts[i] < 0 || in.drafts[i] >= in.valid_vocab) {
      return invalid_argument("speculative accept: draft {} is id {}, outside [0, {})", i + 1,
                              in.drafts[i], in.valid_vocab);
    }
  }
  const SamplingOptions& o = *in.options;
  const int64_t n = static_cast<int64_t>(in.drafts.size());
  out.history.assign(in.output.begin(), in.output.end());
  SampleInput s;
  s.valid_vocab = in.valid_vocab;
  s.options = in.options;
  s.prompt = in.prompt;
  for (int64_t r = 0; r <= n; ++r) {
    s.logits = in.logits + r * in.row_stride;
    s.output = out.history;
    s.position = in.position + r;
    XDS_RETURN_IF_ERROR(sampler.prepare(s));
    if (r == n) {  // every draft passed: the ordinary draw from p_n
      out.tokens.push_back(sampler.pick(sample_uniform(o.seed, s.position, 0)));
      return {};
    }
    const int32_t d = in.drafts[static_cast<size_t>(r)];
    if (sample_uniform(o.seed, s.position, kSpecDrawAccept) < sampler.probability(d)) {
      out.tokens.push_back(d);
      out.history.push_back(d);
      ++out.accepted;
      continue;
    }
    out.tokens.push_back(
        sampler.pick_excluding(d, sample_uniform(o.seed, s.position, kSpecDrawResidual)));
    return {};
  }
  return {};
}

}  // namespace xds::engine
