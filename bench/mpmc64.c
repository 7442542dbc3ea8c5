/* mpmc64 -- many producers, many consumers, every block 64 bytes.
 *
 * N threads each allocate arrays of 64 blocks and hand them to the other threads in
 * turn, which verify and free them; no thread frees its own blocks, and all of them
 * allocate and free on the same size class. See mpmc.h for the details.
 * Checksum: sum of the values freed (checked against the sum allocated) and the bytes
 * freed; it does not depend on the thread count. Total work is fixed; threads share it.
 * Usage: mpmc64 [scale] [threads=4]
 */
#define MPMC_NAME "mpmc64"
#define MPMC_MIXED_SIZES 0
#include "mpmc.h"
