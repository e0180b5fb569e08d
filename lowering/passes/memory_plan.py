"""(being written)"""


def memory_plan(program):
    return program
