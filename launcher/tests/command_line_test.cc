// The command line's parser on its own (src/command_line.h): each kind of option, the ways a
// value is given, the end of the options, PET_ variables, and the one-line errors.
#include "command_line.h"

#include <gtest/gtest.h>

#include <stdlib.h>
#include <algorithm>

#include <string>
#include <vector>

namespace dist::launcher {
namespace {

struct Fields {
  std::string nnodes = "1";
  std::string method = "spawn";
  bool standalone = false;
  bool module = false;
  int port = 0;
  std::vector<std::string> exports;
};

class CommandLineTest : public ::testing::Test {
 protected:
  CommandLineTest() : line_("prog", "A program.", "[OPTIONS] SCRIPT") {
    line_.group("Things");
    line_.text("--nnodes", f_.nnodes, "Nodes").env("PET_TEST_NNODES").show_default();
    line_.text("--start-method,--start_method", f_.method, "How")
        .choices({"spawn", "fork", "forkserver"});
    line_.flag("--standalone", f_.standalone, "Alone").env("PET_TEST_STANDALONE");
    line_.flag("-m,--module", f_.module, "Module");
    line_.number("--ssh-port", f_.port, 1, 65535, "Port");
    line_.list("--export", f_.exports, "Pass VAR");
  }
  void TearDown() override {
    ::unsetenv("PET_TEST_NNODES");
    ::unsetenv("PET_TEST_STANDALONE");
  }
  std::string error(const std::vector<std::string>& args) {
    try {
      line_.parse(args);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

  Fields f_;
  CommandLine line_;
};

TEST_F(CommandLineTest, ValuesSeparateOrAttachedTheLastOneWinsAndTheScriptEndsTheOptions) {
  const auto p =
      line_.parse({"--nnodes", "2", "--nnodes=3", "--start_method=fork", "-m", "--export", "A",
                   "--export=B=1", "--ssh-port", "2222", "train.py", "--nnodes", "9"});
  EXPECT_EQ(f_.nnodes, "3");
  EXPECT_EQ(f_.method, "fork");
  EXPECT_TRUE(f_.module);
  EXPECT_EQ(f_.port, 2222);
  EXPECT_EQ(f_.exports, (std::vector<std::string>{"A", "B=1"}));
  EXPECT_EQ(p.rest, (std::vector<std::string>{"train.py", "--nnodes", "9"}));
  EXPECT_TRUE(p.given.contains("--start-method"));
  EXPECT_TRUE(p.given.contains("--start_method")) << "both spellings count as given";
  EXPECT_FALSE(p.given.contains("--standalone"));
}

TEST_F(CommandLineTest, TwoDashesEndTheOptionsAsWithArgparse) {
  const auto p = line_.parse({"--standalone", "--", "--script-named-like-an-option", "x"});
  EXPECT_TRUE(f_.standalone);
  EXPECT_EQ(p.rest, (std::vector<std::string>{"--script-named-like-an-option", "x"}));
}

TEST_F(CommandLineTest, AFlagTakesNoValueOrOneOrZero) {
  line_.parse({"--standalone=yes", "x"});
  EXPECT_TRUE(f_.standalone);
  line_.parse({"--standalone=0", "x"});
  EXPECT_FALSE(f_.standalone);
  EXPECT_NE(error({"--standalone=maybe", "x"}).find("--standalone takes no value, or 1 or 0"),
            std::string::npos);
  EXPECT_NE(error({"-mfoo"}).find("-m takes no value"), std::string::npos);
}

TEST_F(CommandLineTest, BadValuesAreOneLineErrorsNamingTheOption) {
  EXPECT_EQ(error({"--nnodes"}), "--nnodes needs a value");
  EXPECT_EQ(error({"--start-method", "thread"}),
            "--start-method is one of spawn, fork, forkserver, not 'thread'");
  EXPECT_EQ(error({"--ssh-port", "0"}), "--ssh-port takes a number from 1 to 65535, not '0'");
  EXPECT_EQ(error({"--ssh-port", "22x"}), "--ssh-port takes a number from 1 to 65535, not '22x'");
  EXPECT_EQ(error({"--nnode", "7", "x"}), "") << "a unique prefix abbreviates an option";
  EXPECT_EQ(f_.nnodes, "7");
  EXPECT_NE(error({"--bogus"}).find("unknown option '--bogus'"), std::string::npos);
}

TEST_F(CommandLineTest, AVariableFillsWhatTheCommandLineLeftOutAndCountsAsGiven) {
  ::setenv("PET_TEST_NNODES", "4", 1);
  ::setenv("PET_TEST_STANDALONE", "true", 1);
  auto p = line_.parse({"x"});
  EXPECT_EQ(f_.nnodes, "4");
  EXPECT_TRUE(f_.standalone);
  EXPECT_TRUE(p.given.contains("--nnodes"));
  p = line_.parse({"--nnodes", "5", "x"});
  EXPECT_EQ(f_.nnodes, "5") << "the command line wins";
  ::setenv("PET_TEST_STANDALONE", "2", 1);  // torchrun's bool(int(value))
  line_.parse({"x"});
  EXPECT_TRUE(f_.standalone);
  ::setenv("PET_TEST_STANDALONE", "0", 1);
  line_.parse({"x"});
  EXPECT_FALSE(f_.standalone);
  ::setenv("PET_TEST_STANDALONE", "sometimes", 1);
  EXPECT_EQ(error({"x"}), "PET_TEST_STANDALONE is 1 or 0 (true or false), not 'sometimes'");
}

TEST_F(CommandLineTest, AnEmptyVariableIsReportedUnlessTheCommandLineGaveTheOption) {
  ::setenv("PET_TEST_NNODES", "", 1);
  ::setenv("PET_TEST_STANDALONE", "", 1);
  auto p = line_.parse({"--nnodes", "2", "x"});
  const auto empty = line_.empty_variables(p);
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(empty[0].variable, "PET_TEST_STANDALONE");
  EXPECT_EQ(empty[0].option, "--standalone");
  EXPECT_TRUE(empty[0].flag);
}

TEST_F(CommandLineTest, HelpAndVersionEndTheParseAndHelpListsEveryOptionUnderItsGroup) {
  EXPECT_TRUE(line_.parse({"--help", "--nnodes", "2", "x"}).help);
  EXPECT_TRUE(line_.parse({"--vers"}).version) << "--version abbreviated";
  const std::string help = line_.help();
  EXPECT_NE(help.find("Usage: prog [OPTIONS] SCRIPT"), std::string::npos) << help;
  EXPECT_NE(help.find("\nThings:\n"), std::string::npos) << help;
  EXPECT_NE(help.find("--start-method, --start_method {spawn,fork,forkserver}"), std::string::npos)
      << help;
  EXPECT_NE(help.find("[default: 1] [env: PET_TEST_NNODES]"), std::string::npos) << help;
  EXPECT_NE(help.find("Pass VAR (repeatable)"), std::string::npos) << help;
  for (const auto& name : line_.long_names()) {  // (an underscore spelling add() made: its own)
    std::string declared = name;
    std::replace(declared.begin() + 2, declared.end(), '_', '-');
    EXPECT_TRUE(help.find(name) != std::string::npos || help.find(declared) != std::string::npos)
        << name;
  }
  EXPECT_EQ(help.find("--ssh_port"), std::string::npos) << "made, not declared: not listed";
}

}  // namespace
}  // namespace dist::launcher
