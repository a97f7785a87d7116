/* sim.h — inside the cudasim: what its runtime, scheduler and cuBLAS share. */
#ifndef KVD_CUDASIM_SIM_H
#define KVD_CUDASIM_SIM_H

#include <functional>
#include <string>
#include <cuda_runtime.h>

namespace cudasim {

/*
 * Every block of c's grid, one after another on the calling thread, each
 * CUDA thread a fiber running body. 0, or -EFAULT with why saying which
 * block broke which rule (a deadlock, a shuffle outside its mask, ...).
 */
int run_grid(const launch_cfg &c, const std::function<void()> &body, std::string *why);

/*
 * [p, p + bytes) inside one live device allocation: 1; 0 with why naming
 * what p is (host memory, freed, past the end of a buffer of n bytes).
 */
int device_range(const void *p, size_t bytes, std::string *why);

/* A failure no later call can clear (a faulting kernel), as a device's context keeps it. */
void set_sticky(cudaError_t e, const std::string &msg);
/* The sticky error, or cudaSuccess. */
cudaError_t sticky(void);

}	/* namespace cudasim */

#endif
