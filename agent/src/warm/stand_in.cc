#include "warm/stand_in.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string_view>

#include "warm_python_sources.h"

namespace dist::agent::warm {

namespace fs = std::filesystem;

namespace {

void write_file(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) {
    throw std::runtime_error("cannot write " + path.string() + " (" + std::strerror(errno) + ")");
  }
}

}  // namespace

void write_stand_in_package(const fs::path& dir) {
  const fs::path package = dir / "dist_launch";
  std::error_code ec;
  fs::create_directories(package, ec);
  if (ec) throw std::runtime_error("cannot create " + package.string() + " (" + ec.message() + ")");
  write_file(package / "__init__.py", python::kStandInPackage);
  write_file(package / "snapshot.py", python::kSnapshot);
  write_file(package / "elastic.py", python::kElastic);
}

}  // namespace dist::agent::warm
