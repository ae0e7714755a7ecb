"""PostgreSQL storage: the pool, the migrations, and one module of queries per group.

Every query lives here as a module constant beside the group it serves, with
one typed function that takes a connection. Handlers never write SQL.
"""
