"""Faults beyond crashes (issue 28): partitions, pauses, full and slow disks, skewed clocks,
power loss and a failing S3, each ending with the invariant check, verify and a new write."""
