# Cross-compiling Keel for arm64 (aarch64) Linux with Debian's cross toolchain, and
# running its tests under Debian's qemu-user.
#
#   apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
#   (or: bash scripts/install-deps.sh --cross)
#   cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake
#   cmake --build build-aarch64
#   QEMU_PAGESIZE=65536 ctest --test-dir build-aarch64 -L "api|unit|stress|misuse|pagesize" -E unit.fastpath
#
# scripts/cross-aarch64.sh does all of that for each page size.
#
# Tests run under qemu-user: CMAKE_CROSSCOMPILING_EMULATOR makes ctest start every test
# whose command is a target as  qemu-aarch64 -L <prefix> [-p <page size>] <program> ...
# The page size the emulated program believes in (AT_PAGESZ, and the granularity of its
# mmap) comes from
#   - the cache variable KEEL_QEMU_PAGE_SIZE, fixed at configure time (-p), or, when that
#     is empty (the default),
#   - the environment variable QEMU_PAGESIZE when ctest runs, which qemu-user reads
#     itself; unset means the host's page size (4096 on x86-64).
# so one build directory serves all page sizes. KEEL_QEMU_LD_PREFIX is qemu's -L (where
# the arm64 loader and libc live: /usr/aarch64-linux-gnu from libc6-arm64-cross).
#
# Tests whose command is a shell script that runs a test program (tests/misuse's
# run_misuse.sh) are not covered by CMAKE_CROSSCOMPILING_EMULATOR, and this machine has
# no binfmt_misc to run arm64 programs directly, so KEEL_BASH (the bash those tests are
# started with) is preset to tests/pagesize/emu-bash.sh, which runs the script with
# every arm64 program among its arguments replaced by a small launcher through the
# same emulator. Tests that cannot run under qemu at all (override: real x86-64
# servers; unit.fastpath: valgrind) are excluded by the ctest line above.

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(KEEL_CROSS_TRIPLET aarch64-linux-gnu CACHE STRING "GNU triplet of the cross toolchain")
set(CMAKE_C_COMPILER ${KEEL_CROSS_TRIPLET}-gcc)
set(CMAKE_CXX_COMPILER ${KEEL_CROSS_TRIPLET}-g++)

# Libraries and headers only from the target's sysroot; programs (cmake helpers, bash)
# from the host.
set(CMAKE_FIND_ROOT_PATH /usr/${KEEL_CROSS_TRIPLET})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

set(KEEL_QEMU qemu-aarch64 CACHE STRING "qemu-user binary that runs the tests")
set(KEEL_QEMU_LD_PREFIX /usr/${KEEL_CROSS_TRIPLET} CACHE PATH
  "qemu -L: directory holding the target's loader and libraries")
set(KEEL_QEMU_PAGE_SIZE "" CACHE STRING
  "qemu -p: page size for the tests (empty: QEMU_PAGESIZE from the environment at run time)")

set(CMAKE_CROSSCOMPILING_EMULATOR ${KEEL_QEMU} -L ${KEEL_QEMU_LD_PREFIX})
if(KEEL_QEMU_PAGE_SIZE)
  list(APPEND CMAKE_CROSSCOMPILING_EMULATOR -p ${KEEL_QEMU_PAGE_SIZE})
endif()

# A list: the tests run "${KEEL_BASH} script args...", which becomes
#   bash emu-bash.sh <emulator...> -- script args...
# (find_program(KEEL_BASH ...) in tests/ keeps a value that is already set).
get_filename_component(_keel_src_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
if(EXISTS "${_keel_src_dir}/tests/pagesize/emu-bash.sh")
  set(KEEL_BASH /bin/bash "${_keel_src_dir}/tests/pagesize/emu-bash.sh"
      ${CMAKE_CROSSCOMPILING_EMULATOR} -- CACHE STRING
      "bash for script-driven tests, through tests/pagesize/emu-bash.sh" FORCE)
endif()
