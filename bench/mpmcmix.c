/* mpmcmix -- many producers, many consumers, blocks of 16 B-1 KiB.
 *
 * As mpmc64 (see mpmc.h), but the block sizes are mixed: 80% 16-256 bytes, 20%
 * 257-1024 bytes, drawn from a seed that depends only on the array's index in the run.
 * Checksum: sum of the values freed (checked against the sum allocated) and the bytes
 * freed; it does not depend on the thread count. Total work is fixed; threads share it.
 * Usage: mpmcmix [scale] [threads=4]
 */
#define MPMC_NAME "mpmcmix"
#define MPMC_MIXED_SIZES 1
#include "mpmc.h"
