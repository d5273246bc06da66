"""Vocabulary of the attribute-key parser, as data: qualifier families, role and relation
nouns, verbs, attribute heads and the other word tables :mod:`.parse` reads.

Every table is exercised by the examples in ``tests/unit/test_keys.py``. Pure: tables only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["FAMILIES", "Family"]


@dataclass(frozen=True, slots=True)
class Family:
    """Mutually exclusive qualifiers: two texts with disjoint values of one family are siblings.

    A trigger word counts when it modifies one of ``heads`` (up to three words before the head, or
    "head for/on the trigger" after it), or, where ``heads`` is None, when it stands in the subject
    of the sentence or right after a determiner ("the staging database"). ``loose`` triggers are
    unambiguous enough to count anywhere.
    """

    name: str
    values: dict[str, tuple[str, ...]]
    heads: frozenset[str] | None = None
    loose: frozenset[str] = frozenset()


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_BODY_PARTS = _words(
    "knee knees hip hips ear ears eye eyes hand hands arm arms leg legs foot feet shoulder"
    " shoulders wrist wrists ankle ankles elbow elbows lung kidney breast side molar tooth teeth"
    " lobe heel thumb finger toe cheek temple calf thigh hamstring achilles ventricle atrium"
)


_RELATION_NOUNS = _words(
    "mother mum mom mommy mama father dad daddy papa parent parents wife husband spouse partner"
    " fiance fiancee fiancé fiancée boyfriend girlfriend son sons daughter daughters child children"
    " kid kids baby brother brothers sister sisters sibling siblings twin grandmother grandma gran"
    " granny nan nana grandfather grandpa grandad granddad grandparent grandparents grandson"
    " granddaughter grandchild aunt uncle cousin niece nephew stepson stepdaughter stepmother"
    " stepfather mother-in-law father-in-law sister-in-law brother-in-law son-in-law"
    " daughter-in-law boss manager supervisor assistant colleague coworker co-worker teammate"
    " friend roommate flatmate housemate neighbour neighbor landlord landlady tenant nanny"
    " caregiver carer ceo cfo cto coo cio ciso founder co-founder cofounder secretary pa deputy"
    " dog dogs cat cats puppy kitten horse pony rabbit parrot hamster"
)


_CHILD_NOUNS = _words("son daughter child kid baby brother sister sibling twin boy girl one")


FAMILIES: tuple[Family, ...] = (
    Family(
        "direction",
        {
            "outbound": ("outbound", "outward", "departing", "onward", "out"),
            "return": ("return", "inbound", "homebound", "homeward", "returning", "back"),
        },
        _words(
            "flight flights leg legs ticket tickets trip journey train ferry bus coach sailing"
            " booking seat seats baggage bag bags allowance transfer date segment crossing pickup"
            " drive fare connection departure flies fly flying flew"
        ),
        frozenset({"outbound", "outward", "inbound", "homebound", "homeward"}),
    ),
    Family(
        "address",
        {
            "billing": ("billing", "invoice", "invoicing"),
            "shipping": ("shipping", "delivery", "ship-to", "dispatch"),
            "home": ("home", "residential", "personal", "private"),
            "work": ("work", "office", "business", "company", "corporate"),
            "mailing": ("mailing", "postal", "correspondence"),
            "registered": ("registered",),
        },
        _words("address addresses postcode zip"),
    ),
    Family(
        "usage",
        {
            "personal": ("personal", "private", "home", "own"),
            "work": ("work", "office", "business", "company", "corporate", "professional"),
        },
        _words(
            "phone phones number numbers mobile cell cellphone landline line email e-mail inbox"
            " laptop computer pc desktop machine device calendar account car vehicle card server"
            " extension handset tablet ipad iphone"
        ),
    ),
    Family(
        "phone_type",
        {
            "mobile": ("mobile", "cell", "cellphone", "cellular"),
            "landline": ("landline", "desk", "fixed-line"),
        },
        _words("phone phones number numbers line landline mobile cell cellphone"),
    ),
    Family(
        "environment",
        {
            "staging": ("staging", "stage", "stg", "pre-prod", "preprod", "pre-production"),
            "production": ("production", "prod", "live"),
            "development": ("development", "dev"),
            "test": ("test", "testing", "qa", "uat"),
            "sandbox": ("sandbox",),
            "preview": ("preview",),
        },
        None,
        frozenset({"staging", "pre-prod", "preprod", "pre-production", "production", "prod"}),
    ),
    Family(
        "platform",
        {
            "ios": ("ios", "iphone", "ipad"),
            "android": ("android",),
            "web": ("web", "browser"),
            "desktop": ("desktop", "windows", "macos", "mac"),
        },
        _words(
            "app apps application client build builds release releases sdk store listing widget"
        ),
    ),
    Family(
        "tier",
        {
            "frontend": ("frontend", "front-end", "client-side"),
            "backend": ("backend", "back-end", "server-side"),
        },
        None,
        frozenset({"frontend", "front-end", "backend", "back-end"}),
    ),
    Family(
        "rank",
        {
            "primary": ("primary", "main", "first"),
            "secondary": ("secondary", "second", "backup", "alternate", "alternative"),
            "tertiary": ("tertiary", "third"),
        },
    ),
    Family(
        "side",
        {"left": ("left",), "right": ("right",)},
        _BODY_PARTS | _words("wing lane hand-side"),
    ),
    Family(
        "compass",
        {
            "north": ("north", "northern"),
            "south": ("south", "southern"),
            "east": ("east", "eastern"),
            "west": ("west", "western"),
        },
        _words(
            "wing side entrance gate office building campus branch tower block car-park lot stand"
            " exit door site depot warehouse yard"
        ),
    ),
    Family(
        "floor",
        {
            "upstairs": ("upstairs", "top-floor", "upper-floor"),
            "downstairs": ("downstairs", "ground-floor", "basement", "lower-floor"),
        },
        None,
        frozenset({"upstairs", "downstairs", "top-floor", "upper-floor", "ground-floor"}),
    ),
    Family(
        "meal",
        {
            "breakfast": ("breakfast",),
            "lunch": ("lunch", "lunchtime"),
            "dinner": ("dinner", "supper"),
        },
        None,
        frozenset({"breakfast", "lunch", "lunchtime", "dinner", "supper"}),
    ),
    Family(
        "department",
        {
            "sales": ("sales",),
            "support": ("support", "helpdesk", "help-desk", "service-desk"),
            "billing": ("billing", "accounts", "finance", "ap", "invoicing"),
            "technical": ("technical", "tech", "it", "engineering"),
            "legal": ("legal",),
            "hr": ("hr", "people"),
            "marketing": ("marketing",),
            "security": ("security",),
            "procurement": ("procurement", "purchasing"),
            "compliance": ("compliance",),
            "operations": ("operations", "ops"),
        },
        _words(
            "contact contacts lead team rep representative manager email inbox queue line channel"
            " owner person poc department dept officer director head liaison"
        ),
    ),
    Family(
        "account",
        {
            "checking": ("checking", "current", "chequing"),
            "savings": ("savings", "saving", "deposit"),
            "credit": ("credit",),
            "brokerage": ("brokerage", "investment", "trading"),
            "retirement": ("retirement", "pension", "401k", "ira", "isa"),
        },
        _words("account accounts acct"),
    ),
    Family(
        "age",
        {
            "elder": ("older", "oldest", "elder", "eldest", "big"),
            "younger": ("younger", "youngest", "little", "baby"),
            "middle": ("middle",),
        },
        _CHILD_NOUNS | _words("sons daughters children kids brothers sisters"),
    ),
    Family(
        "garment",
        {
            "shoe": ("shoe", "shoes", "footwear", "boots", "trainers", "sneakers"),
            "top": ("top", "tops", "shirt", "shirts", "t-shirt", "t-shirts", "blouse", "blouses"),
            "bottom": ("trousers", "pants", "jeans", "skirt", "skirts", "shorts", "waist"),
            "dress": ("dress", "dresses"),
            "ring": ("ring",),
            "jacket": ("jacket", "jackets", "coat", "coats"),
        },
        _words("size sizes fit"),
    ),
    Family(
        "scope",
        {
            "group": ("group", "global", "parent", "holding", "worldwide"),
            "local": ("subsidiary", "branch", "arm", "division", "regional", "local"),
        },
    ),
    Family(
        "log",
        {
            "application": ("app", "application", "applications"),
            "audit": ("audit",),
            "access": ("access",),
            "error": ("error",),
            "system": ("system",),
        },
        _words("log logs logging"),
    ),
    Family(
        "telemetry",
        {
            "logs": ("logs", "log", "logging"),
            "metrics": ("metrics", "metric"),
            "traces": ("traces", "trace", "tracing", "spans"),
            "backups": ("backup", "backups", "snapshot", "snapshots"),
        },
        _words("retention retained kept stored storage"),
    ),
    Family(
        "loyalty",
        {
            "airline": ("airline", "frequent-flyer", "flyer", "flying"),
            "hotel": ("hotel",),
            "rail": ("rail",),
            "car_rental": ("car-rental", "rental"),
        },
        _words("status loyalty membership points program programme tier card elite miles number"),
    ),
    Family(
        "course",
        {
            word: (word,)
            for word in (
                "english spanish french german italian portuguese mandarin chinese cantonese"
                " japanese korean arabic russian dutch swedish norwegian danish finnish polish"
                " hindi urdu turkish greek latin hebrew welsh irish piano violin viola cello guitar"
                " bass drums flute clarinet trumpet trombone saxophone harp ukulele singing voice"
                " swimming football soccer tennis ballet dance karate judo taekwondo gymnastics"
                " chess art drama coding maths math physics chemistry biology history yoga pilates"
                " spin climbing riding rugby cricket hockey netball basketball baseball athletics"
                " running cycling rowing fencing boxing"
            ).split()
        },
        _words(
            "class classes lesson lessons course courses teacher tutor exam exams practice practise"
            " club coach training session sessions camp recital tuition homework grade"
        ),
    ),
)


# Region codes mark a regional arm of a company ("Baymark Cargo UK"); matched case-sensitively.
_REGION_CODES = frozenset(
    "UK US USA EU EMEA APAC LATAM ANZ DACH UAE AMER NZ AU DE FR NL JP SG".split()
)


_INSTANCE_MARKERS = {
    "second": "second",
    "another": "another",
    "additional": "additional",
    "third": "third",
    "fourth": "fourth",
    "extra": "extra",
    "separate": "separate",
}


_INSTANCE_BLOCKERS = _words("to into for with from than of by via instead")


_DETERMINERS = _words("the a an our my your his her their its this that these those both each")


_POSSESSIVE_PRONOUNS = _words("my our your his her their its")


_SUBJECT_PRONOUNS = {"i": "self", "we": "self", "he": "pron", "she": "pron", "they": "pron"}


_PREPOSITIONS = _words(
    "on for at in of with from to during via under over by about near into onto per as after"
    " before since until than between within without across"
)


_TITLES = _words("dr mr mrs ms miss mx prof sir dame")


_ROLE_NOUNS = _words(
    "customer customers client clients patient patients user users tenant tenants member members"
    " student students guest guests caller buyer buyers account family household company team"
    " employee employees candidate applicant subscriber resident owner"
)


_AUX = _words(
    "is are was were be been being am has have had will would can could should must might does do"
    " did got gets isn't aren't wasn't weren't doesn't don't didn't hasn't haven't won't can't"
    " it's he's she's they're we're i'm i've we've they've"
)


_PRE_VERB = _words(
    "no not never now just recently also still usually always currently finally already often"
    " sometimes typically normally only used"
)


_VERBS = _words(
    "lives live works runs uses takes plays prefers wants needs goes drives owns pays costs"
    " requires supports manages sees sends receives opens closes flies leaves arrives starts ends"
    " expires renews teaches studies speaks wears likes loves hates enjoys says keeps sits stays"
    " shops subscribes syncs ships grows sells handles employs leases rents visits attends trains"
    " swims practises practices travels commutes cycles walks reads writes hosts serves covers"
    " includes allows signs approves reports belongs holds joins quit quits left became becomes"
    " moves switches upgrades downgrades migrates changes reschedules cancels books orders buys"
    " bought sold sent made took gave went came began begun ran wrote drove flew grew kept told"
    " lets let goes sleeps eats drinks smokes suffers deploys deploy builds built hit rose fell"
    " cut put set reaches earns lasts go live pay prefer want get arrive leave receive require"
    " see send take run use departs lands boards returns"
)


_NOT_VERB_ED = _words(
    "need bed red seed speed feed shed breed hundred sacred naked wicked bred reed weed deed steed"
    " greed tweed embed"
)


_NUMBER_WORDS = _words(
    "one two three four five six seven eight nine ten eleven twelve twenty thirty forty fifty"
    " hundred thousand first second third half both all each every several some many few no none"
)


_CALENDAR = _words(
    "january february march april may june july august september october november december jan feb"
    " mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday"
    " sunday mondays tuesdays wednesdays thursdays fridays saturdays sundays today tomorrow"
    " yesterday tonight weekday weekdays weekend weekends morning evening night spring summer"
    " autumn fall winter christmas easter"
)


_STARTERS = _words(
    "please keep use write explain start skip prefer show respond sign avoid always never don't"
    " do note update fyi btw also so then when if while because since after before both each"
    " every all any some no yes here there this that these those it its what which who whose"
    " where how why new old current previous next last latest rent mortgage search design"
    " dashboards dashboard metrics ingestion alerts uptime error errors application applications"
    " audit trace traces logs log snapshots backups backup workers worker room hotel order orders"
    " flight flights train trains checkout delivery payment payments invoices invoice direct crash"
    " two-factor staff office meeting standup budget revenue price project release version sprint"
    " home work data cost costs total annual monthly weekly daily yearly average minimum maximum"
    " max min default standard premium basic free pro enterprise plan plans tier insurance policy"
    " contract renewal subscription seats seat licence license storage quota retention region"
    " cluster server servers database databases frontend backend api app apps service services"
    " team teams support sales billing shipping security compliance legal marketing finance"
    " engineering product products customer client patient user users tenant member guest"
    " parent-teacher e2e ci cd sso mfa 2fa vpn email emails phone phones mobile landline address"
    " birthday appointment appointments school class classes lesson lessons car bike bus doctor"
    " dentist gp nurse physio therapist vet gym membership diet allergy allergies medication"
    " dose breakfast lunch dinner return outbound personal private primary secondary main"
    " upstairs downstairs left right first second third another other"
)


# Canonical attributes: head nouns (and a few verbs) that name the same attribute.
_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "home_city": (
        "city",
        "town",
        "hometown",
        "residence",
        "lives",
        "living",
        "resides",
        "relocated",
        "moved",
        "headquarters",
        "hq",
        "head-office",
        "based",
        "location",
    ),
    "address": ("address", "addresses", "addr", "postcode", "zip"),
    "phone": ("phone", "telephone", "tel", "mobile", "cell", "cellphone", "landline", "extension"),
    "email": ("email", "e-mail", "inbox", "mail"),
    "job": (
        "job",
        "role",
        "position",
        "title",
        "occupation",
        "employer",
        "profession",
        "career",
        "works",
        "employed",
    ),
    "plan": ("plan", "tier", "subscription", "package", "edition"),
    "seats": ("seats", "seat", "licences", "licenses"),
    "price": ("price", "cost", "costs", "fee", "fees", "rate", "premium", "charge"),
    "medication": ("dose", "dosage", "medication", "meds", "medicine", "prescription"),
    "allergy": ("allergy", "allergies", "allergic"),
    "appointment": ("appointment", "appt", "consultation", "check-up", "checkup"),
    "opening_hours": ("opens", "opening", "hours", "closes", "closing"),
    "birthday": ("birthday", "dob", "born"),
    "timezone": ("timezone", "time-zone"),
    "language": ("language", "languages"),
    "retention": ("retention", "retained", "kept"),
    "payment_method": ("payment", "paid", "pays"),
    "contact": ("contact", "poc", "liaison"),
}


_ATTRIBUTE_OF = {word: attr for attr, words in _ATTRIBUTES.items() for word in words}


_GENERIC_HEADS = _words(
    "number date time day name size setting settings value level details info id code status"
    " type window schedule"
)


_TIME_WORDS = _CALENDAR | _words(
    "week weeks month months year years quarter day days this next last today tonight currently"
)


_ADJECTIVES = _words("preferred current new old usual regular main default latest previous own")


_TOKEN = re.compile(
    r"(?P<word>[^\W_](?:[\w.:/+&@#%-]*[\w%])?(?:['’](?:t|re|ve|ll|d|m)\b)?|[#£$€+][\w.,/+-]*\w)"
    r"(?P<poss>['’]s\b|(?<=s)['’](?![\w]))?"
    r"|(?P<punct>[:;,()—–]|\.(?=\s|$))"
)


_IDENT = re.compile(r"^#[\w-]*\d[\w-]*$|^[A-Z]{1,4}-?\d{3,}$")


_NAME_MORPHOLOGY = re.compile(r"(?:ed|ly|tion|sion|ment|ness|ity|ship|ance|ence|ism|ings?)$")


_UNIT_AFTER = _words(
    "mg mcg g kg ml l km mi miles m cm mm gb tb mb kb % percent seats users days weeks months"
    " years hours minutes mins h pm am nodes units staff people passengers kids children times"
    " puffs tablets pills"
)


_LABEL_LIMIT = 12


_COPULAS = _words("is are was were be been joined became becomes 's")


_VALUE_PREPOSITIONS = _words("on in into onto as to from at")


_CHANGE_VERBS = _words(
    "moved switched changed transferred went promoted reassigned upgraded downgraded migrated"
    " rotated rebooked rescheduled"
)


_INTRODUCERS = _words("a an another two three four new second")


_DIRECTION_AFTER = {"back": "return", "home": "return", "out": "outbound", "there": "outbound"}


_UNIT_NOUNS = _words(
    "flat apt apartment unit room suite house plot lot bay gate platform site store branch building"
    " block floor table desk locker court pitch stand ward bed cabin"
)


_UNIT_NUMBER = re.compile(r"^(?:\d+[A-Za-z]?|[A-Z])$")


_CHANGE_CUE = re.compile(
    r"\b(?:new|now|changed|switched|hired|replaced|sold|appointed|took over|no longer)\b",
    re.IGNORECASE,
)


_IMPERATIVES = _words(
    "keep respond reply answer write use avoid show explain include add skip start stop switch"
    " format always never please don't do make give list put cite mention call translate convert"
    " round remember note send text email be try"
)


_NEVER_NAMES = (
    _CALENDAR
    | _DETERMINERS
    | _PREPOSITIONS
    | _AUX
    | _TITLES
    | frozenset(_SUBJECT_PRONOUNS)
    | _words("it you me us them him and or but the")
)


_POST_LINKS = _words("for on in of at the a an my our his her their its (")


def _transpositions(word: str) -> set[str]:
    return {word[:i] + word[i + 1] + word[i] + word[i + 2 :] for i in range(len(word) - 1)}


def _trigger_index() -> dict[str, tuple[tuple[str, str], ...]]:
    index: dict[str, list[tuple[str, str]]] = {}
    for family in FAMILIES:
        for value, triggers in family.values.items():
            for trigger in triggers:
                index.setdefault(trigger, []).append((family.name, value))
    exact = set(index)
    for trigger in list(exact):
        if len(trigger) >= 6:
            for variant in _transpositions(trigger) - exact:
                index.setdefault(variant, []).extend(index[trigger])
    return {word: tuple(pairs) for word, pairs in index.items()}


_TRIGGERS = _trigger_index()


_FAMILY = {family.name: family for family in FAMILIES}


_FAMILY_ORDER = (*_FAMILY, "id")


_CANONICAL_TRIGGER = {
    variant: trigger
    for family in FAMILIES
    for triggers in family.values.values()
    for trigger in triggers
    if len(trigger) >= 6
    for variant in _transpositions(trigger)
} | {trigger: trigger for family in FAMILIES for ts in family.values.values() for trigger in ts}


_VOCABULARY = (
    frozenset(_TRIGGERS)
    | _RELATION_NOUNS
    | _ROLE_NOUNS
    | _DETERMINERS
    | _PREPOSITIONS
    | _AUX
    | _PRE_VERB
    | _VERBS
    | _NUMBER_WORDS
    | _CALENDAR
    | _STARTERS
    | _TITLES
    | frozenset(_ATTRIBUTE_OF)
    | frozenset(_SUBJECT_PRONOUNS)
    | frozenset({"it", "you", "me", "us", "them", "him"})
)
