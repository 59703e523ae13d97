// Shared by the files of commlayer.backends._torch_fast_paths (see launcher.c for what it is).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "../common/tensor_meta.h"

// Interned names and constants, made once by the module's init (module.c).
extern PyObject *str_shape, *str_dim, *str_view, *str_wait, *str_result, *str_torch_work, *str_done,
    *str_dtype, *str_device, *str_layout, *str_is_contiguous, *minus_one, *zero, *empty_tuple;

extern PyTypeObject LauncherType, PlannedP2PType, PlannedCollectiveType, PlannedPairedType, CWorkType, TimedType, TimedLogType,
    P2PEntryType;
// The parameter names of isend/send (tensor, dst, group, tag, group_dst) and irecv/recv (src, group_src).
extern PyObject *send_names[5], *recv_names[5];

// A PlannedP2P's call on (tensor, peer, group, tag, group_peer), its no_plan, whether it receives (planned.c).
PyObject *planned_p2p(PyObject *planned, PyObject *const *args);
PyObject *planned_no_plan(PyObject *planned);
int planned_receives(PyObject *planned);

// A new C Work (work.c) around torch's Work, its result the one tensor given.
PyObject *cwork_new(PyObject *torch_work, PyObject *result_tensor);
// work_support(TorchWork, raise_typed) -> the C Work type (work.c).
PyObject *work_support(PyObject *module, PyObject *args);
// commlayer.core._tensor_meta's reader, once set_tensor_meta() handed it over (module.c); NULL:
// the tensor's Python attributes are asked.
extern CommlayerTensorMetaReader tensor_meta_reader;
// Whether dict version tags mark every change (planned.c's inline cache relies on it); -1 on error.
int check_dict_versions(void);
// planned.c's helpers, shared with paired.c: a dict's version tag (0 where unusable), whether a
// held weak reference (or None) is group, and (dtype, device, layout) of a tensor (new references;
// -1 with an exception set).
extern int dict_versions_usable;
uint64_t dict_version(PyObject *dict);
int same_group(PyObject *held, PyObject *group);
// What an inline cache holds of its group argument: a weak reference (a destroyed group must not
// be kept alive by a cache), None for None; NULL, no exception set, for a group that takes none.
PyObject *held_weakly(PyObject *group);
int tensor_attributes(PyObject *tensor, PyObject **attributes);
// A TimedLog's (timed_log.c) append, its calls not folded yet, and its capacity.
void timed_log_append(PyObject *log, PyObject *label, long long nbytes, long long began_ns, long long ended_ns);
Py_ssize_t timed_log_unfolded(PyObject *log);
Py_ssize_t timed_log_capacity(PyObject *log);
// The interned names of timed.c (the comms logger's timer), made by the module's init.
int timed_init_names(void);
