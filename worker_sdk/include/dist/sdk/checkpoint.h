// Checkpoints of named float tensors (model and optimizer state) plus the step they were taken at,
// and named byte strings (such as DistributedDataParallel::state()).
// Written atomically (temporary file, fsync, rename, fsync of the directory), so a crash leaves
// either the previous checkpoint or the new one, never a torn file; a checksum guards the rest.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dist::sdk {

// A tensor of any element type and shape: its raw bytes, little-endian, in C order. dtype is
// torch's name: float32, float64, float16, bfloat16, int8, int16, int32, int64, uint8, bool,
// complex64, complex128. Snapshots keep these (save_snapshot, load_snapshot: the tensors torch and
// numpy workers save come back with their types and shapes); checkpoint files do not.
struct TypedTensor {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;
};

struct Checkpoint {
  std::uint64_t step = 0;
  std::map<std::string, std::vector<float>> tensors;
  // "= {}": {step, tensors} initializes a Checkpoint without -Wmissing-field-initializers.
  std::map<std::string, std::string> blobs = {};
  // Snapshots: tensors of other types and shapes (a name is in `tensors` or here, not both).
  std::map<std::string, TypedTensor> typed = {};
};

// The size of one element of `dtype` (above); 0 for a name it does not know.
std::size_t dtype_size(const std::string& dtype);

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Writes `checkpoint` to `path` atomically, making its directory when missing. Throws
// CheckpointError naming the path and the errno.
void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint);

// Reads a checkpoint; nullopt when the file does not exist. Throws CheckpointError when it exists
// but is not a complete, intact checkpoint.
std::optional<Checkpoint> load_checkpoint(const std::filesystem::path& path);

}  // namespace dist::sdk
