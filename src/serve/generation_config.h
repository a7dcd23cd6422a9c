// generation_config.json's sampling defaults (`serve`/`gateway --generation-config auto|none`).
//
// As vLLM does by default, the temperature, top_p and top_k that a model publishes in its
// generation_config.json (Qwen3: 0.6 / 0.95 / 20) apply to requests that do not set them; a
// request's own values always win (make_sampling_options in openai_api.h). With "none", or
// without the file, the OpenAI defaults apply (temperature 1, top_p 1, no top_k).
//   temperature  a number >= 0
//   top_p        a number in (0, 1]
//   top_k        an integer; 0 or negative (transformers' "off") is no top-k
//   do_sample    false (transformers' greedy) makes the default temperature 0
// Other fields (eos_token_id, max_length, ...) are read elsewhere or not used. A field of the
// wrong type or range is an error naming the file and the field.
// Pure functions apart from reading the file; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "serve/openai_api.h"

namespace xds::serve {

// `text` is generation_config.json's content; `name` prefixes errors.
Result<SamplingDefaults> sampling_defaults_from_generation_config(std::string_view text,
                                                                  const std::string& name);

// mode "auto": model_dir/generation_config.json if present (else the OpenAI defaults);
// "none": the OpenAI defaults. Another mode is an error naming it.
Result<SamplingDefaults> load_sampling_defaults(const std::string& model_dir,
                                                std::string_view mode);

}  // namespace xds::serve
