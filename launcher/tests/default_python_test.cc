// Which interpreter runs Python workers when PYTHON_EXEC is unset: the one next to dist-launch (a
// venv's bin/, where pip installs it), else python3 from PATH; PYTHON_EXEC still wins. Checked on
// the function and on a real dist-launch copied into a directory with its own python3.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/launcher/cli.h"

namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "dist-default-python-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A file with `text`, executable when `mode` says so.
void write_file(const fs::path& path, const std::string& text, fs::perms mode) {
  std::ofstream(path) << text;
  fs::permissions(path, mode);
}
constexpr fs::perms kExecutable = fs::perms::owner_all;
constexpr fs::perms kPlain = fs::perms::owner_read | fs::perms::owner_write;

TEST(DefaultPython, ThePythonNextToTheProgramElsePython3FromPath) {
  struct Case {
    std::string name;
    std::vector<std::pair<std::string, fs::perms>> files;  // in the program's directory
    std::string expected;  // "<dir>/NAME" for NAME in that directory, or "python3" (PATH)
  };
  const std::vector<Case> cases = {
      {"a venv's bin: python3 first",
       {{"python3", kExecutable}, {"python", kExecutable}},
       "<dir>/python3"},
      {"only python", {{"python", kExecutable}}, "<dir>/python"},
      {"a python3 that cannot run", {{"python3", kPlain}}, "python3"},
      {"no interpreter there (a build tree)", {}, "python3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    for (const auto& [file, mode] : c.files) write_file(dir.path() / file, "#!/bin/sh\n", mode);
    const std::string expected = c.expected.starts_with("<dir>/")
                                     ? (dir.path() / c.expected.substr(6)).string()
                                     : c.expected;
    EXPECT_EQ(dist::launcher::default_python(dir.path() / "dist-launch"), expected);
  }
  TempDir dir;
  fs::create_directory(dir.path() / "python3");  // a directory is not an interpreter
  EXPECT_EQ(dist::launcher::default_python(dir.path() / "dist-launch"), "python3");
  // A relative or unknown path (no /proc) never means the current directory's python3.
  EXPECT_EQ(dist::launcher::default_python("dist-launch"), "python3");
  EXPECT_EQ(dist::launcher::default_python(""), "python3");
}

struct RunResult {
  int exit_code;
  std::string output;
};

RunResult run_shell(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe)) output += buffer.data();
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// dist-launch installed as pip installs it: a bin/ holding the program and a python3 (here a
// shell script that says it ran), run without PYTHON_EXEC, then with it.
TEST(DefaultPython, AnInstalledDistLaunchRunsWorkersWithThePythonBesideIt) {
  TempDir dir;
  const fs::path bin = dir.path() / "bin";
  fs::create_directory(bin);
  fs::copy_file(DIST_LAUNCH_BIN, bin / "dist-launch");  // a copy: /proc/self/exe resolves links
  write_file(bin / "python3", "#!/bin/sh\necho \"venv python3 runs $*\"\n", kExecutable);
  write_file(dir.path() / "other-python", "#!/bin/sh\necho \"PYTHON_EXEC runs $*\"\n", kExecutable);
  write_file(dir.path() / "train.py", "", kPlain);

  const std::string launch = (bin / "dist-launch").string() + " --nproc-per-node 2 " +
                             (dir.path() / "train.py").string() + " --lr 1";
  RunResult r = run_shell("env -u PYTHON_EXEC " + launch);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const std::string rank : {"0", "1"}) {
    EXPECT_NE(r.output.find("[default" + rank + "]:venv python3 runs -u " +
                            (dir.path() / "train.py").string() + " --lr 1"),
              std::string::npos)
        << r.output;
  }

  r = run_shell("env PYTHON_EXEC=" + (dir.path() / "other-python").string() + " " + launch);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[default0]:PYTHON_EXEC runs -u"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("venv python3"), std::string::npos) << r.output;
}

}  // namespace
