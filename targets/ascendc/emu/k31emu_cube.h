// k31emu cube path (placeholder; filled in below).
#pragma once
#include "k31emu_copy.h"
