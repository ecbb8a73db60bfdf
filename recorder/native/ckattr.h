#pragma once

#include <pybind11/pybind11.h>

namespace ckattr {

// Adds the Attributor class (ckattr.cpp) to the extension's module.
void bind(pybind11::module_& m);

}  // namespace ckattr
