"""What requests used and the limits they count against: usage summed and written to the
store in batches (spilled to disk while the store is away), the tokens counted against
day and month budgets, and every rate and concurrency limit divided between the planes
serving ``/v1``.
"""
