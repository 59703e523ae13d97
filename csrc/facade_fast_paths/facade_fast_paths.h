// Shared by the files of commlayer.facade.calls._fast_paths: the facade's fast paths in C, that
// is the plan lookups of the planned ops (one_tensor.c, paired.c) and the C entries of
// commlayer.dist's isend/irecv/send/recv (p2p_entries.c). module.c makes the module.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <structmember.h>

#include "../common/tensor_meta.h"

// Interned names and constants, made once by the module's init (module.c).
extern PyObject *str_dtype, *str_device, *str_layout, *str_is_contiguous, *zero;

extern PyTypeObject PlannedP2PType, PlannedCollectiveType, PlannedPairedType, P2PEntryType;
// The parameter names of isend/send (tensor, dst, group, tag, group_dst) and irecv/recv (src, group_src).
extern PyObject *send_names[5], *recv_names[5];

// A PlannedP2P's call on (tensor, peer, group, tag, group_peer), its no_plan, whether it receives
// (one_tensor.c).
PyObject *planned_p2p(PyObject *planned, PyObject *const *args);
PyObject *planned_no_plan(PyObject *planned);
int planned_receives(PyObject *planned);
// commlayer.core._tensor_meta's reader, once set_tensor_meta() handed it over (module.c); NULL:
// the tensor's Python attributes are asked.
extern CommlayerTensorMetaReader tensor_meta_reader;
// Whether dict version tags mark every change (one_tensor.c's inline cache relies on it); -1 on error.
int check_dict_versions(void);
// one_tensor.c's helpers, shared with paired.c: a dict's version tag (0 where unusable), whether a
// held weak reference (or None) is group, and (dtype, device, layout) of a tensor (new references;
// -1 with an exception set).
extern int dict_versions_usable;
uint64_t dict_version(PyObject *dict);
int same_group(PyObject *held, PyObject *group);
// What an inline cache holds of its group argument: a weak reference (a destroyed group must not
// be kept alive by a cache), None for None; NULL, no exception set, for a group that takes none.
PyObject *held_weakly(PyObject *group);
int tensor_attributes(PyObject *tensor, PyObject **attributes);
