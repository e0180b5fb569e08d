"""(being written)"""


def streams(program):
    return program
