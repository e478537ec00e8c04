"""placeholder"""
def add_parser(sub):
    return sub.add_parser("plot", help="(in progress)")
def run(args):
    return 0
