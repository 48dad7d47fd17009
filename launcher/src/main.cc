#include <iostream>

#include "dist/launcher/cli.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const auto outcome = dist::launcher::parse_command_line(args, std::cout, std::cerr);
  return outcome.exit_code;
}
