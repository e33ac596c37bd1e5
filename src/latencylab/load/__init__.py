"""Load testing: arrival processes, the open-loop generator, clients and capacity search."""
