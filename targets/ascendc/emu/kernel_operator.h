// k31emu: a clean-room CPU emulation of the AscendC kernel API subset k31dsl emits (see
// README.md next to this file).  Generated kernels `#include "kernel_operator.h"`; with a CANN
// toolchain that resolves to the real header, on the host to this one.
#pragma once
#include "k31emu_core.h"
#include "k31emu_tensor.h"
#include "k31emu_copy.h"
#include "k31emu_vector.h"
#include "k31emu_cube.h"
