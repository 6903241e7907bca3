/* The SGD solver's step for one float32 parameter (csrc/updates.pyx's sgd_step): L2 regularization, momentum
   and, optionally, Net::Update in one pass over memory, with the float32 operations of
   pycaffe_dist/solver/updates.py's regularize and sgd in their order, so that the results are the same bits.
   Kept as a header, declared to Cython in updates.pyx, so that it reads and compiles as the C it is; built with
   -ffp-contract=off (setup.py), which keeps every a * b + c two roundings. */
#ifndef PCD_SGD_STEP_H
#define PCD_SGD_STEP_H

/* One loop per case, over restrict pointers, so that gcc vectorizes it (the operations stay the same: no
   FMA under -ffp-contract=off). applied: NULL, or data itself, read before it is written. */
static void pcd_sgd_step(const float* data, float* restrict diff, float* restrict history, float* applied,
                         long n, float decay, float rate, float momentum) {
    if (decay != 0 && applied) {
        for (long i = 0; i < n; i++) {
            float h = history[i] * momentum + rate * (diff[i] + decay * data[i]);
            history[i] = h; diff[i] = h; applied[i] = data[i] - h;
        }
    } else if (decay != 0) {
        for (long i = 0; i < n; i++) {
            float h = history[i] * momentum + rate * (diff[i] + decay * data[i]);
            history[i] = h; diff[i] = h;
        }
    } else if (applied) {
        for (long i = 0; i < n; i++) {
            float h = history[i] * momentum + rate * diff[i];
            history[i] = h; diff[i] = h; applied[i] = data[i] - h;
        }
    } else {
        for (long i = 0; i < n; i++) {
            float h = history[i] * momentum + rate * diff[i];
            history[i] = h; diff[i] = h;
        }
    }
}
#endif
