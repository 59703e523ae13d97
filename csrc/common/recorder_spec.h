// Generated from commlayer/core/flight_recorder.py by `python -m commlayer.core.flight_recorder`:
// do not edit. tests/observability/test_recorder_spec.py fails when the two differ.
#pragma once

// An entry's slots (ENTRY_FIELDS).
enum {
    RECORDER_ENTRY_SEQ = 0,
    RECORDER_ENTRY_OP = 1,
    RECORDER_ENTRY_SHAPE = 2,
    RECORDER_ENTRY_DTYPE = 3,
    RECORDER_ENTRY_ROOT = 4,
    RECORDER_ENTRY_STATE = 5,
    RECORDER_ENTRY_QUEUED_NS = 6,
    RECORDER_ENTRY_COMPLETED_NS = 7,
    RECORDER_ENTRY_WORK = 8,
    RECORDER_ENTRY_SLOTS = 9
};

// The fields of a Recording, which C reads by name (csrc/common/recorder.h).
#define RECORDER_FIELD_NEXT_SEQ "next_seq"
#define RECORDER_FIELD_RING "ring"
#define RECORDER_FIELD_CAPACITY "capacity"
#define RECORDER_FIELD_OP "op"
#define RECORDER_FIELD_DTYPE "dtype"
#define RECORDER_FIELD_ROOT "root"
#define RECORDER_FIELD_FAIL "fail"

// An entry's states.
#define RECORDER_ENTRY_STARTED "started"
#define RECORDER_ENTRY_COMPLETED "completed"
