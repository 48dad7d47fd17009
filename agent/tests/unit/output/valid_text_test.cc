// Text the agent writes for readers that expect UTF-8: what is not UTF-8 replaced, as Unicode
// recommends, and every JSON dump of such text valid and parseable.
#include "output/valid_text.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace dist::agent {
namespace {

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

TEST(ValidUtf8, WellFormedTextIsKeptAndEachIllFormedSubpartReplacedOnce) {
  struct Case {
    const char* name;
    std::string in;
    std::string out;
  };
  const Case cases[] = {
      {"ascii", "train.py --lr 0.1", "train.py --lr 0.1"},
      {"two, three and four bytes", "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80",
       "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"},
      {"latin-1 byte", "caf\xE9.py", "caf" + kReplacement + ".py"},
      {"lone continuation bytes",
       "a\x80\xBF"
       "b",
       "a" + kReplacement + kReplacement + "b"},
      {"truncated at the end", "x\xE2\x82", "x" + kReplacement},
      {"truncated before ascii", "\xF0\x9F\x98.", kReplacement + "."},
      {"overlong", "\xC0\xAF", kReplacement + kReplacement},
      {"overlong three", "\xE0\x80\xAF", kReplacement + kReplacement + kReplacement},
      {"surrogate", "\xED\xA0\x80", kReplacement + kReplacement + kReplacement},
      {"above U+10FFFF", "\xF4\x90\x80\x80",
       kReplacement + kReplacement + kReplacement + kReplacement},
      {"never a byte", "\xFF\xFE", kReplacement + kReplacement},
      {"nul stays", std::string("a\0b", 3), std::string("a\0b", 3)},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(valid_utf8(c.in), c.out);
    EXPECT_TRUE(is_valid_utf8(valid_utf8(c.in)));
    EXPECT_EQ(is_valid_utf8(c.in), c.in == c.out);
  }
}

TEST(JsonText, ANameThatIsNotUtf8IsDumpedWithTheReplacementInsteadOfThrowing) {
  nlohmann::ordered_json j = {{"entrypoint", "caf\xE9.py"}, {"args", {"--name", "\xFF"}}};
  EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);  // what took the agent down
  const std::string text = json_text(j);
  EXPECT_TRUE(is_valid_utf8(text));
  const auto back = nlohmann::json::parse(text);
  EXPECT_EQ(back["entrypoint"], "caf" + kReplacement + ".py");
  EXPECT_EQ(back["args"][1], kReplacement);
  const nlohmann::json plain = {{"ok", "caf\xC3\xA9"}};
  EXPECT_EQ(json_text(plain), plain.dump());
}

// What Python's json.dump (ensure_ascii, torch's @record) writes for a path that is not UTF-8:
// the byte as a lone surrogate escape, which nlohmann refuses.
TEST(LenientJson, LoneSurrogateEscapesBecomeTheReplacementAndPairsStay) {
  const std::string python = R"({"message": "No such file: caf\udce9.py", "pair": "\ud83d\ude00",)"
                             R"( "escaped": "a\\udce9", "high": "\ud800x", "raw": "caf)"
                             "\xE9"
                             R"("})";
  EXPECT_FALSE(nlohmann::json::accept(python));
  const auto j = nlohmann::json::parse(lenient_json(python));
  EXPECT_EQ(j["message"], "No such file: caf" + kReplacement + ".py");
  EXPECT_EQ(j["pair"], "\xF0\x9F\x98\x80");
  EXPECT_EQ(j["escaped"], "a\\udce9");  // an escaped backslash, then text: not an escape
  EXPECT_EQ(j["high"], kReplacement + "x");
  EXPECT_EQ(j["raw"], "caf" + kReplacement);
}

}  // namespace
}  // namespace dist::agent
