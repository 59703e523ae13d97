// Shared by the files of commlayer.comms_logger._fast_paths: the comms logger's fast path in C,
// its per-plan timer (timed.c) and the ring of timed calls it writes (timed_log.c). module.c
// makes the module.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "../common/tensor_meta.h"

extern PyTypeObject TimedType, TimedLogType;
// commlayer.core._tensor_meta's reader, once set_tensor_meta() handed it over (module.c); NULL:
// the tensor's Python attributes are asked.
extern CommlayerTensorMetaReader tensor_meta_reader;
// A TimedLog's (timed_log.c) append, its calls not folded yet, and its capacity.
void timed_log_append(PyObject *log, PyObject *label, long long nbytes, long long began_ns, long long ended_ns);
Py_ssize_t timed_log_unfolded(PyObject *log);
Py_ssize_t timed_log_capacity(PyObject *log);
// The interned names of timed.c, made by the module's init.
int timed_init_names(void);
