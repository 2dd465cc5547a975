// The interpreter against Jinja2 itself: tests/data/chat_templates/{goldens,features}.json were
// rendered by Debian's python3-jinja2 as transformers configures it
// (scripts/make_template_goldens.py); every case must come out byte for byte the same.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "helios/gguf.h"
#include "helios/jinja.h"
#include "test_paths.h"

namespace helios::jinja {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string templates_dir() { return testing::test_data_dir() + "/chat_templates/"; }

nlohmann::ordered_json load_cases(const std::string& name) {
  const std::string text = read_file(templates_dir() + name);
  EXPECT_FALSE(text.empty()) << "missing " << templates_dir() << name;
  return nlohmann::ordered_json::parse(text.empty() ? "{\"cases\": []}" : text);
}

Value json_value(const nlohmann::ordered_json& j) {
  auto v = Value::from_json(j.dump());
  EXPECT_TRUE(v.ok()) << v.status().to_string();
  return v.ok() ? *v : Value();
}

// The instant the goldens' strftime_now formats: 2024-07-26 09:30:00 local time.
RenderOptions fixed_clock() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 9;
  tm.tm_min = 30;
  tm.tm_isdst = -1;
  RenderOptions options;
  options.now = std::chrono::system_clock::from_time_t(std::mktime(&tm));
  return options;
}

void expect_case(const Template& tmpl, const std::map<std::string, Value>& vars, const nlohmann::ordered_json& c,
                 const std::string& label) {
  auto out = tmpl.render(vars, fixed_clock());
  if (c.contains("error")) {
    ASSERT_FALSE(out.ok()) << label << ": expected the template to raise";
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << label << ": " << out.status().to_string();
    EXPECT_NE(out.status().message().find(c["error"].get<std::string>()), std::string::npos)
        << label << ": " << out.status().message();
    return;
  }
  ASSERT_TRUE(out.ok()) << label << ": " << out.status().to_string();
  EXPECT_EQ(out->bytes(), c["expected"].get<std::string>()) << label;
}

TEST(TemplateGolden, FeaturesMatchJinja2) {
  const auto data = load_cases("features.json");
  ASSERT_GT(data["cases"].size(), 50u);
  for (const auto& c : data["cases"]) {
    const std::string name = c["name"].get<std::string>();
    auto tmpl = Template::parse(c["template"].get<std::string>());
    ASSERT_TRUE(tmpl.ok()) << name << ": " << tmpl.status().to_string();
    std::map<std::string, Value> vars;
    for (auto it = c["variables"].begin(); it != c["variables"].end(); ++it) vars[it.key()] = json_value(it.value());
    expect_case(*tmpl, vars, c, name);
  }
}

TEST(TemplateGolden, ConversationsMatchJinja2) {
  const auto data = load_cases("goldens.json");
  ASSERT_EQ(data["cases"].size(), 90u);  // 5 templates x 9 conversations x with and without the generation prompt
  std::map<std::string, StatusOr<Template>> templates;
  for (const auto& c : data["cases"]) {
    const std::string model = c["template"].get<std::string>();
    if (!templates.count(model)) {
      const std::string source = read_file(templates_dir() + model + ".jinja");
      ASSERT_FALSE(source.empty()) << "missing " << templates_dir() << model << ".jinja";
      templates.emplace(model, Template::parse(source));
    }
    const auto& tmpl = templates.at(model);
    ASSERT_TRUE(tmpl.ok()) << model << ": " << tmpl.status().to_string();
    const std::string label = model + " / " + c["conversation"].get<std::string>() +
                              (c["add_generation_prompt"].get<bool>() ? " + generation prompt" : "");
    const auto& conversation = data["conversations"][c["conversation"].get<std::string>()];
    std::map<std::string, Value> vars = {
        {"messages", json_value(conversation["messages"])},
        {"tools", conversation.contains("tools") ? json_value(conversation["tools"]) : Value::none()},
        {"documents", Value::none()},
        {"add_generation_prompt", Value::boolean(c["add_generation_prompt"].get<bool>())},
        {"bos_token", Value::string(Text::literal(c["bos_token"].get<std::string>()))},
        {"eos_token", Value::string(Text::literal(c["eos_token"].get<std::string>()))},
    };
    expect_case(*tmpl, vars, c, label);
  }
}

// The committed Qwen templates are the Qwen pair's own (their GGUFs differ in one line).
TEST(TemplateGolden, QwenTemplatesAreTheModelsOwn) {
  const std::pair<const char*, const char*> pairs[] = {
      {"qwen2.5-coder-0.5b-instruct.jinja", "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"},
      {"qwen2.5-coder-1.5b-instruct.jinja", "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"},
  };
  int checked = 0;
  for (const auto& [committed, model] : pairs) {
    const std::string path = testing::models_dir() + "/" + model;
    if (!std::filesystem::exists(path)) continue;
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    auto tmpl = (*file)->get_string("tokenizer.chat_template");
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
    EXPECT_EQ(*tmpl, read_file(templates_dir() + committed)) << model;
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "the Qwen pair is not in " << testing::models_dir() << " (scripts/fetch_model.sh qwen-pair)";
}

}  // namespace
}  // namespace helios::jinja
