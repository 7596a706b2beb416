# _slots exports Python functions only (step_slot_arrays, touched_blocks, check_step_layout,
# check_step_pages): nothing here for other extensions to cimport yet.
