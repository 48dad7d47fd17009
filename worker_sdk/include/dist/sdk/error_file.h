// The C++ counterpart of torch's @record: write why this worker fails to TORCHELASTIC_ERROR_FILE,
// so dist-launch (or torchrun) names it, with its message and time, in the failure report.
#pragma once

#include <string>

namespace dist::sdk {

// Writes {"message": {"message": message, "extraInfo": {"py_callstack": details,
// "timestamp": "<seconds since the epoch, with fractions>"}}} to $TORCHELASTIC_ERROR_FILE.
// Returns false (and writes nothing) when the variable is unset or the file cannot be written.
bool write_error_file(const std::string& message, const std::string& details = "");

}  // namespace dist::sdk
