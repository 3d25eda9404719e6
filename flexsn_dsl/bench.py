"""``flexsn-dsl bench``: placeholder replaced below."""


def add_arguments(parser) -> None:
    parser.add_argument("specs", nargs="+")


def main(args) -> int:
    raise NotImplementedError
