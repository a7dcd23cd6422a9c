// Chat templates as published (DeepSeek-V3, DeepSeek-R1, Qwen3, Kimi K2 Thinking) rendered by
// our Jinja subset against @huggingface/jinja's output, then tokenized against
// @huggingface/tokenizers' ids (tests/fixtures/tokenizer/gen/gen_fixtures.mjs).
#include "fixtures.h"
#include "tokenizer/chat_template.h"

namespace xds {
namespace {

struct Family {
  std::string name;
  std::string template_file;  // "" = chat_template of tokenizer_dir's tokenizer_config.json
  std::string tokenizer_dir;  // "" = no tokenizer (no ids to check)
};

const Family kFamilies[] = {
    {"deepseek_v3", "", "deepseek_v3"},
    {"qwen3", "", "qwen3"},
    {"deepseek_r1", "templates/deepseek_r1.jinja", "deepseek_v3"},
    {"kimi_k2_thinking", "templates/kimi_k2_thinking.jinja", ""},
};

ChatTemplate load_template(const Family& f) {
  const std::string dir = test::fixture_dir() + "/";
  if (f.template_file.empty()) {
    auto t = ChatTemplate::from_tokenizer_config(dir + f.tokenizer_dir);
    XDS_CHECK(t.ok(), "{}", t.status().to_string());
    return std::move(t).value();
  }
  auto t = ChatTemplate::from_file(dir + f.template_file);
  XDS_CHECK(t.ok(), "{}", t.status().to_string());
  if (f.tokenizer_dir.empty()) return std::move(t).value();
  auto ctx = ChatTemplate::special_tokens_context(dir + f.tokenizer_dir);
  XDS_CHECK(ctx.ok(), "{}", ctx.status().to_string());
  return t->with_context(*ctx);
}

TEST(ChatTemplate, PublishedTemplatesMatchHuggingFaceJinja) {
  const auto cases = test::read_json(test::fixture_dir() + "/gen/chat_cases.json");
  for (const Family& f : kFamilies) {
    const ChatTemplate tmpl = load_template(f);
    const Tokenizer* tok = f.tokenizer_dir.empty() ? nullptr : &test::fixture_tokenizer(f.tokenizer_dir);
    const auto expected = test::read_json(test::fixture_dir() + "/expected/chat_" + f.name + ".json");
    ASSERT_FALSE(expected.empty());
    for (const auto& e : expected) {
      const nlohmann::ordered_json* c = nullptr;
      for (const auto& x : cases) {
        if (x["name"] == e["name"]) c = &x;
      }
      ASSERT_NE(c, nullptr);
      const bool agp = e["add_generation_prompt"];
      const auto tools = c->contains("tools") ? (*c)["tools"] : nlohmann::ordered_json();
      auto got = tmpl.render_ordered((*c)["messages"], agp, tools);
      ASSERT_TRUE(got.ok()) << f.name << "/" << e["name"] << ": " << got.status().to_string();
      EXPECT_EQ(*got, e["rendered"].get<std::string>()) << f.name << "/" << e["name"] << " agp=" << agp;
      if (tok) {
        // transformers' apply_chat_template + encode trusts the messages: our kTrusted.
        auto ids =
            encode_chat_ordered(*tok, tmpl, (*c)["messages"], agp, tools, MessageTrust::kTrusted);
        ASSERT_TRUE(ids.ok()) << ids.status().to_string();
        EXPECT_EQ(*ids, e["ids"].get<std::vector<int32_t>>()) << f.name << "/" << e["name"];
        // Untrusted messages (serve's default) give the same ids, except in the one case whose
        // message holds marker text ("<|im_end|> <｜User｜>"): there the same text, other ids.
        auto untrusted = encode_chat_ordered(*tok, tmpl, (*c)["messages"], agp, tools);
        ASSERT_TRUE(untrusted.ok()) << untrusted.status().to_string();
        if (e["name"] == "single_user") {
          EXPECT_NE(*untrusted, *ids) << f.name;
          EXPECT_EQ(tok->decode(*untrusted, false), tok->decode(*ids, false)) << f.name;
        } else {
          EXPECT_EQ(*untrusted, *ids) << f.name << "/" << e["name"];
        }
        if (tok->adds_bos()) {  // the DeepSeek templates emit {{ bos_token }}: exactly one BOS
          ASSERT_GE(ids->size(), 2u);
          EXPECT_EQ((*ids)[0], *tok->bos_id());
          EXPECT_NE((*ids)[1], *tok->bos_id());
        }
      }
    }
  }
  // A template that does not emit BOS gets one from encode_chat when add_bos_token is set.
  const Tokenizer* tok = &test::fixture_tokenizer("deepseek_v3");
  auto tmpl = ChatTemplate::from_string("{% for m in messages %}{{ m.content }}{% endfor %}", "inline");
  ASSERT_TRUE(tmpl.ok());
  nlohmann::json msgs = nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}});
  auto ids = encode_chat(*tok, *tmpl, msgs, false);
  ASSERT_TRUE(ids.ok());
  auto plain = tok->encode("hi", false);
  ASSERT_TRUE(plain.ok());
  std::vector<int32_t> want{0};
  want.insert(want.end(), plain->begin(), plain->end());
  EXPECT_EQ(*ids, want);
}

TEST(ChatTemplate, MissingTemplateNamesFileAndField) {
  auto t = ChatTemplate::from_tokenizer_config(test::fixture_dir() + "/templates");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("chat_template"), std::string::npos) << t.status().message();
}

}  // namespace
}  // namespace xds
