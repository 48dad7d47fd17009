// The five libudev functions that Debian's static hwloc (libhwloc.a) references, answering "no
// udev": dist-launch then needs no libudev.so.1, which manylinux does not count among the libraries
// every Linux has. Linked, libudev made every start load one more shared library, and made the
// binary wheel (scripts/wheel.sh) carry a copy of it, which auditwheel can only serve by moving
// the program out of the environment's bin/ behind a Python shim.
//
// What hwloc loses is nothing dist-launch reads. hwloc 2.x opens a udev context when its Linux
// backend starts on the real root (topology-linux.c: `data->udev = udev_new()`) and uses it for one
// thing, a block device's vendor, model and serial number, which it otherwise reads from
// /run/udev/data; every use is behind `if (data->udev)`. The agent's topology keeps no I/O object
// at all (placement.cc: HWLOC_TYPE_FILTER_KEEP_NONE for I/O types). So udev_new() fails, as
// libudev's own does when it cannot allocate, and the other four are never reached: given a
// context, which nobody has, they do what libudev does with a null one.
//
// Built only where hwloc is linked statically (agent/CMakeLists.txt): a shared libhwloc brings
// its own libudev.
#if __has_include(<libudev.h>)
#include <libudev.h>  // the compiler then checks each definition against libudev's declaration
#else
extern "C" {
struct udev;
struct udev_device;
}
#endif

extern "C" {

struct udev* udev_new(void) {
  return nullptr;
}

struct udev* udev_unref(struct udev*) {
  return nullptr;
}

struct udev_device* udev_device_new_from_subsystem_sysname(struct udev*, const char*, const char*) {
  return nullptr;
}

const char* udev_device_get_property_value(struct udev_device*, const char*) {
  return nullptr;
}

struct udev_device* udev_device_unref(struct udev_device*) {
  return nullptr;
}

}  // extern "C"
