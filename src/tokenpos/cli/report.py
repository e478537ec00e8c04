"""placeholder"""
def add_parser(sub):
    return sub.add_parser("report", help="(in progress)")
def run(args):
    return 0
